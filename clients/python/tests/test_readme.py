"""The README's examples run as written: each ```python block of
clients/python/README.md that talks to `fenced dev` runs here against a
test cluster (its dev endpoints replaced by the cluster's), so an example
that drifts from the client fails."""

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
DEV = '["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"]'


def _examples():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return [b for b in blocks if DEV in b]


def test_the_readme_has_a_runnable_example():
    assert _examples(), "no ```python example against fenced dev in the README"


def test_every_readme_example_against_fenced_dev_runs(cluster):
    for code in _examples():
        code = code.replace(DEV, repr(cluster.endpoints))
        scope: dict = {}
        exec(compile(code, str(README), "exec"), scope)
        # The first example writes every row with its lease's token.
        if "written" in scope:
            tokens = {t for _, t in scope["written"]}
            assert len(scope["written"]) == 3 and len(tokens) == 1, scope["written"]
