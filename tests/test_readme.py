"""The README is the front door: its first line and its Python snippet must hold."""

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_starts_with_the_title():
    assert README.read_text().splitlines()[0] == "# cdmpp"


def test_readme_python_snippet_runs_as_written(capsys):
    snippets = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert snippets, "the README has no Python snippet"
    exec(compile(snippets[0], "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "Prediction(seconds=" in printed
