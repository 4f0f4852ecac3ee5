"""The docs' results pages, generated from the JSON the benchmarks write (issue #53).

``python -m benchmarks.report`` (``make results``) writes ``docs/results/*.md``: one page per question, each table
rendered from a file of ``benchmarks/results/`` and headed by the host, device, date and command that produced it.
``--check`` regenerates in memory and fails when a page differs from the committed one (the tests run it), so a
figure in the docs cannot drift from its JSON. The pages are listed in ``pages.py``; renderers a benchmark does not
already provide are in ``tables.py``.
"""
