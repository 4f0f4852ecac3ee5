"""Where things are: the checkout, the bundled configs, the scripts the tests run in fresh processes."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
SCRIPTS = ROOT / "tests" / "scripts"
