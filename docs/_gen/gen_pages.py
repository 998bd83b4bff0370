"""Run by mkdocs-gen-files at every build: writes the generated reference pages into the site."""

import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, for tests.*

from tests.docs_reference import PAGES

for name, page in PAGES.items():
    with mkdocs_gen_files.open(name, "w") as handle:
        handle.write(page())
