"""RLHF frameworks beyond verl, read as verl: one table per framework (tables.py), and the
translation of a framework's step into a verl-keyed record (translate.py).

Pure: no I/O. The readers of each framework's output live in `sources/`.
"""

from .tables import (
    ACTOR_FRAMEWORKS,
    AREAL,
    FRAMEWORKS,
    NEMO_RL,
    OPENRLHF,
    ROLL,
    SLIME,
    TABLES,
    VERL,
    Framework,
)
from .translate import Translator, is_timer, to_record

__all__ = [
    "ACTOR_FRAMEWORKS",
    "AREAL",
    "FRAMEWORKS",
    "NEMO_RL",
    "OPENRLHF",
    "ROLL",
    "SLIME",
    "TABLES",
    "VERL",
    "Framework",
    "Translator",
    "is_timer",
    "to_record",
]
