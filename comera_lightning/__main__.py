"""``python -m comera_lightning``: the ``comera-lightning`` command line (see :mod:`comera_lightning.cli`)."""

from comera_lightning.cli import main

if __name__ == "__main__":
    main()
