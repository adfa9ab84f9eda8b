"""The documentation that is derived from the code stays in step with it."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _module_index():
    spec = importlib.util.spec_from_file_location("module_index", ROOT / "docs" / "module_index.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_architecture_pages_module_index_lists_every_module_as_it_describes_itself():
    index = _module_index()
    page = index.ARCHITECTURE.read_text()
    assert index.written(page) == page, "docs/architecture.md's module index is stale: run python docs/module_index.py"
    assert "`agentd/procfs.py` | The one reader of ``/proc/<pid>``" in page  # a row as the module words it


def test_every_module_says_what_it_is():
    index = _module_index()
    undescribed = [name for name in index.modules() if not index.described(ROOT / name)]
    assert undescribed == [], f"modules without a docstring or leading comment: {undescribed}"
