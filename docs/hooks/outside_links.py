"""MkDocs hook (mkdocs.yml, ``hooks:``): the pages' links out of docs/ work on the site as they do on GitHub.

* ``../README.md`` (the repository's front page) leads to the site's front page, ``index.md``, whose headings
  carry the README anchors the pages link to (``#install``, ``#results``).
* Any other file of the checkout that a page links to out of docs/ (a results PNG) is copied into the site
  under ``repo/``, and MkDocs resolves the link to the copy.

Anything else out of docs/ (another Markdown file, a path that does not exist) is left to MkDocs, whose
``validation`` then reports it and ``strict`` fails the build.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

_LINK = re.compile(r"(\]\()([^)\s#]+)")
_README = "../README.md"


def _resolve(page_uri: str, target: str) -> str:
    """The link's target as a path relative to docs/ (``../`` first when it lies outside)."""
    return posixpath.normpath(posixpath.join(posixpath.dirname(page_uri), target))


def on_files(files, config):
    """Add the out-of-docs files the pages link to (``README.md`` aside) as copies under ``repo/``."""
    docs = Path(config["docs_dir"])
    for page in files.documentation_pages():
        for _, target in _LINK.findall(Path(page.abs_src_path).read_text(encoding="utf-8")):
            uri = _resolve(page.src_uri, target)
            outside = uri.startswith("../") and not uri.startswith("../../") and uri != _README
            if outside and files.get_file_from_path(uri) is None and (docs / uri).is_file():
                files.append(File(uri, str(docs), config["site_dir"], config["use_directory_urls"],
                                  dest_uri=f"repo/{uri[3:]}", inclusion=InclusionLevel.INCLUDED))
    return files


def on_page_markdown(markdown, page, config, files):
    """Point links to ``../README.md`` at the site's front page."""
    here = posixpath.dirname(page.file.src_uri) or "."

    def swap(match: re.Match) -> str:
        if _resolve(page.file.src_uri, match[2]) != _README:
            return match[0]
        return match[1] + posixpath.relpath("index.md", here)

    return _LINK.sub(swap, markdown)
