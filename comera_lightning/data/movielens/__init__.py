"""MovieLens-100K as a click log: RecBole's atomic files read (``files``), encoded as click features and split
(``features``), served by :class:`MovieLensClicksDataModule` (``datamodule``)."""

from comera_lightning.data.movielens.datamodule import MovieLensClicksDataModule
from comera_lightning.data.movielens.files import locate_movielens_100k

__all__ = ["MovieLensClicksDataModule", "locate_movielens_100k"]
