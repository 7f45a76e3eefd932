"""The docs' examples run as written: each ```python block of
clients/python/README.md and docs/GUIDE.md that talks to `fenced dev` runs
here against a test cluster (its dev endpoints replaced by the cluster's),
so an example that drifts from the client fails."""

import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOCS = [HERE.parent / "README.md", HERE.parent.parent.parent / "docs" / "GUIDE.md"]
DEV = '["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"]'


def _examples(doc: Path):
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    return [b for b in blocks if DEV in b]


def test_each_doc_has_a_runnable_example():
    for doc in DOCS:
        assert _examples(doc), f"no ```python example against fenced dev in {doc}"


def test_every_example_against_fenced_dev_runs(cluster):
    for doc in DOCS:
        for code in _examples(doc):
            _run(doc, code.replace(DEV, repr(cluster.endpoints)))


def _run(doc: Path, code: str) -> None:
    scope: dict = {}
    exec(compile(code, str(doc), "exec"), scope)
    # The statement examples write every row with their lease's one token.
    if "written" in scope:
        tokens = {t for _, t in scope["written"]}
        assert len(scope["written"]) == 3 and len(tokens) == 1, (doc, scope["written"])
