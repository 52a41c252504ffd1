"""The code says each thing once: measured numbers and their history live in benchmarks/
(presets.md, CLAIMS.md, README.md) and CHANGELOG.md, not in the code.

- The ``presets`` dicts of the built-in methods carry at most one line of why per preset
  and a pointer to its evidence: all of them together hold ≤ 50 comment lines.
- At most two source files (dpgen_bench/, methods/, evaluators/) carry a date: dated notes
  are history, which belongs in CHANGELOG.md or benchmarks/.
- Code and tests name the behaviour they protect, never a tracker's number for it."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_PRESET_COMMENT_LINES = 50
MAX_DATED_FILES = 2
DATE = re.compile(r"20[0-9]{2}-[0-9]{2}-[0-9]{2}")
TRACKER_NUMBER = re.compile(r"[Ii]ssue ?#?[0-9]+|#[0-9]{2}\b")


def _sources(*dirs: str, suffixes: tuple[str, ...] = (".py",)) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*")
                  if p.suffix in suffixes and p.is_file() and "__pycache__" not in p.parts)


def preset_spans(source: str) -> list[tuple[int, int]]:
    """The line spans (first, last) of every ``presets = {...}`` class attribute."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.Assign):
                targets, value = stmt.targets, stmt.value
            elif isinstance(stmt, ast.AnnAssign):
                targets, value = [stmt.target], stmt.value
            else:
                continue
            if value is not None and any(isinstance(t, ast.Name) and t.id == "presets" for t in targets):
                spans.append((stmt.lineno, stmt.end_lineno))
    return spans


def preset_comment_lines(source: str) -> int:
    """How many lines inside the ``presets`` dicts of ``source`` carry a comment."""
    spans = preset_spans(source)
    lines = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT and any(a <= tok.start[0] <= b for a, b in spans)}
    return len(lines)


def test_the_counter_sees_comments_inside_a_presets_dict_only():
    source = '''
class M:
    # not in the dict
    presets = {
        # one
        "quick": {"digits": dict(steps=1)},  # two
        "tiny": {"*": dict(steps=2)},
    }
    # after it
'''
    assert preset_spans(source) == [(4, 8)]
    assert preset_comment_lines(source) == 2


def test_the_presets_dicts_carry_at_most_fifty_comment_lines():
    counts = {}
    for path in _sources("methods"):
        source = path.read_text(encoding="utf-8")
        if preset_spans(source):
            counts[str(path.relative_to(ROOT))] = preset_comment_lines(source)
    assert len(counts) >= 9, counts  # every built-in method's module was read
    assert sum(counts.values()) <= MAX_PRESET_COMMENT_LINES, (
        f"{sum(counts.values())} comment lines in the presets dicts: give a preset one line of why and a "
        f"pointer to benchmarks/presets.md (or docs/provenance.md), and move its numbers there", counts)


def test_at_most_two_source_files_carry_dated_notes():
    dated = [str(p.relative_to(ROOT)) for p in _sources("dpgen_bench", "methods", "evaluators")
             if DATE.search(p.read_text(encoding="utf-8"))]
    assert len(dated) <= MAX_DATED_FILES, (
        "dated notes are history: move them to CHANGELOG.md or benchmarks/", dated)


def test_code_and_tests_name_behaviour_not_tracker_numbers():
    paths = _sources("dpgen_bench", "methods", "evaluators", "tests", suffixes=(".py", ".sh"))
    paths += sorted(p for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh"))
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in paths
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if TRACKER_NUMBER.search(line)]
    assert not hits, "name the behaviour a note protects, not its issue number:\n" + "\n".join(hits)


MEAN_STD = re.compile(r"[0-9]\.[0-9]+ ± [0-9]\.[0-9]+")


def test_no_mean_std_result_is_copied_into_more_than_two_files():
    """A measured mean ± std lives in its generated home (CLAIMS.md, the README's table) and at
    most one page that explains it; every other place links."""
    skip = {".venv", "results", "build", ".git", "mutants", "node_modules"}
    files = [p for p in ROOT.rglob("*") if p.suffix in (".md", ".py") and p.is_file()
             and not skip & set(p.relative_to(ROOT).parts)]
    where: dict[str, set[str]] = {}
    for p in files:
        for m in MEAN_STD.findall(p.read_text(encoding="utf-8", errors="replace")):
            where.setdefault(m, set()).add(str(p.relative_to(ROOT)))
    copied = {m: sorted(v) for m, v in where.items() if len(v) > 2}
    assert len(where) > 50 and not copied, copied
