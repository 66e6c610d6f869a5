"""The README and docs/ kept in step with the code they describe.

In process, no subprocess: the option sets come from the argparse parsers ``ptdash``
itself builds (``cli._run_parser``, ``subcommands.PARSERS``), the keys from the rows the
dashboard's help screen shows (``app.help_rows``, built from the app's, the charts' and
the Layers tab's bindings). What the docs name is read from their code: inline
`` `spans` `` and fenced blocks, never prose.

- Every option ``ptdash`` accepts is documented: each run option in the README's options
  table, each subcommand's options on a ``ptdash SUB ...`` command line of the README or a
  docs page. Every option the docs name on a ``ptdash`` command line, or alone in a span,
  exists.
- The README's keys table lists exactly the keys the help screen lists.
- The two set-up commands are where ``.ci/run`` finds them, install what pyproject.toml
  declares, and run a subcommand that exists.
- The README stays a short page that links every docs/ page, and every relative link of
  the docs resolves, anchors included.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

from ptdash.tui import cli, subcommands
from ptdash.tui.fork import NOT_OPTIONS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS, ROOT / "benchmarks" / "README.md"]

FOREIGN_OPTIONS = {
    "-n": "pytest-xdist's process count, in the test command",
    "--n": "a script's own option, in the README's example of what ptdash leaves to the script",
}
"""Options the docs name alone in a span that are other programs', not ptdash's."""

HELP_FLAGS = {"-h", "--help"}


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _fenced(text: str) -> tuple[list[str], str]:
    """The lines of every fenced code block, and the text without them."""
    lines, rest, inside = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
            continue
        (lines if inside else rest).append(line)
    return lines, "\n".join(rest)


def code_pieces(text: str) -> list[str]:
    """Every inline code span and every line of a fenced block."""
    lines, prose = _fenced(text)
    return lines + re.findall(r"`([^`\n]+)`", prose)


def ptdash_commands(text: str) -> list[list[str]]:
    """The words after ``ptdash`` of every ``ptdash ...`` command line in ``text``'s code,
    placeholders' brackets taken off (``[--all]`` -> ``--all``; ``[options]`` left out), cut at
    ``&&``, a pipe or a comment."""
    commands = []
    for piece in code_pieces(text):
        for match in re.finditer(r"(?:^|[\s/$])ptdash((?:\s+\S+)*)", piece):
            words = re.split(r"\s+(?:&&|\||#|;)\s+.*", match.group(1), maxsplit=1)[0].split()
            words = [w.strip("[]()") for w in words if w != "[options]"]
            commands.append([w for w in words if w and w != "..."])
    return commands


def _options(parser) -> list[set[str]]:
    """Each optional argument of ``parser`` as the set of its spellings, help left out."""
    return [set(a.option_strings) for a in parser._actions
            if a.option_strings and not set(a.option_strings) & HELP_FLAGS]


def _spellings(parser) -> set[str]:
    return {s for spellings in _options(parser) for s in spellings} | HELP_FLAGS


RUN_PARSER = cli._run_parser()
SUB_PARSERS = {name: subcommands.parser(name) for name in subcommands.PARSERS}


def split_command(words: list[str]) -> tuple[str | None, list[str]]:
    """(subcommand or None for a run, the options ptdash itself takes) of one command line:
    a run's options end where the script starts (``cli._script_start``), a subcommand's
    are every option after it; the demo's own options (after ``demo``) are the script's."""
    first = cli._first_positional(words)
    if first is not None and words[first] in cli.SUBCOMMANDS:
        sub = words[first]
        if sub == "demo":
            return None, [w for w in words[:first] if w.startswith("-")]
        return sub, [w for w in words[first + 1:] if re.fullmatch(r"--?[a-z][\w-]*", w)]
    return None, [w for w in words[:cli._script_start(words)] if w.startswith("-")]


def _all_commands() -> list[tuple[Path, list[str]]]:
    return [(page, words) for page in PAGES for words in ptdash_commands(_text(page))]


def _section(text: str, heading: str) -> str:
    """The text under the ``heading`` line, up to the next heading of its level or above."""
    level = heading.split(" ")[0]
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    ends = [m.start() for m in re.finditer(rf"\n#{{1,{len(level)}}} ", text[start:])]
    return text[start:start + ends[0]] if ends else text[start:]


def _table_first_cells(section: str) -> list[str]:
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [re.split(r"(?<!\\)\|", row)[1] for row in rows[2:]]


# ------------------------------------------------------------------------ options


def test_the_docs_name_only_options_that_exist():
    wrong = []
    for page, words in _all_commands():
        sub, options = split_command(words)
        known = _spellings(SUB_PARSERS[sub] if sub else RUN_PARSER)
        if sub == "fork":  # ptdash fork takes the run options too, but for the script's and --resume
            known |= _spellings(RUN_PARSER) - set(NOT_OPTIONS)
        wrong += [f"{page.name}: `ptdash {' '.join(words)}`: {o} is not an option of ptdash{' ' + sub if sub else ''}"
                  for o in options if o.split("=")[0] not in known]
    every = _spellings(RUN_PARSER).union(*(_spellings(p) for p in SUB_PARSERS.values()))
    for page in PAGES:
        for piece in code_pieces(_text(page)):
            alone = re.fullmatch(r"(--?[a-z][\w-]*)(?: \S+)?", piece)
            if alone and alone.group(1) not in every and alone.group(1) not in FOREIGN_OPTIONS:
                wrong.append(f"{page.name}: `{piece}`: no ptdash command has {alone.group(1)}")
    assert not wrong, "\n".join(wrong)


def test_every_run_option_is_in_the_readme_options_table():
    table = " ".join(_table_first_cells(_section(_text(README), "## Usage")))
    named = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", table))
    usage = {o for words in ptdash_commands(_section(_text(README), "## Usage"))
             for o in split_command(words)[1] if split_command(words)[0] is None}
    missing = [sorted(spellings)[-1] for spellings in _options(RUN_PARSER) if not spellings & (named | usage)]
    assert not missing, f"run options missing from the README's options table (## Usage): {missing}"


@pytest.mark.parametrize("sub", sorted(SUB_PARSERS))
def test_every_subcommand_option_is_on_a_documented_command_line(sub):
    shown = set()
    for _, words in _all_commands():
        named, options = split_command(words)
        if named == sub:
            shown |= set(options)
    assert sub == "demo" or shown or any(split_command(w)[0] == sub for _, w in _all_commands()), \
        f"no `ptdash {sub} ...` command line in the README or docs/"
    missing = [sorted(spellings)[-1] for spellings in _options(SUB_PARSERS[sub]) if not spellings & shown]
    assert not missing, f"options of `ptdash {sub}` on no `ptdash {sub} ...` line of the README or docs/: {missing}"


def test_every_subcommand_has_a_usage_line_in_the_readme():
    usage = ptdash_commands(_section(_text(README), "## Usage"))
    firsts = {words[cli._first_positional(words)] for words in usage if cli._first_positional(words) is not None}
    assert set(cli.SUBCOMMANDS) <= firsts, f"subcommands with no line in the README's usage: " \
                                          f"{sorted(set(cli.SUBCOMMANDS) - firsts)}"


# --------------------------------------------------------------------------- keys


def _expand(cell: str) -> set[str]:
    """The keys of a keys-table cell: each `key` span, `1`..`6` as the keys between."""
    keys = set(re.findall(r"`([^`]+)`", cell))
    for a, b in re.findall(r"`(\w)`\.\.`(\w)`", cell):
        keys |= {chr(c) for c in range(ord(a), ord(b) + 1)}
    return keys


def readme_keys() -> set[str]:
    return set().union(*(_expand(cell) for cell in _table_first_cells(_section(_text(README), "## Keys"))))


def help_keys() -> set[str]:
    from ptdash.tui.app import help_rows

    return {key for key, _, _ in help_rows(lambda action, parameters: True, True)}


def test_the_readme_keys_table_lists_every_key_of_the_help_screen():
    missing = help_keys() - readme_keys()
    assert not missing, f"keys on the help screen but not in the README's keys table: {sorted(missing)}"


def test_every_key_of_the_readme_is_bound():
    unbound = readme_keys() - help_keys()
    assert not unbound, f"keys in the README's keys table that the dashboard does not bind: {sorted(unbound)}"


def epilog_keys() -> set[str]:
    """The keys ``ptdash --help``'s epilog names: ``space pause/resume, c checkpoint, ..., , . cursor``."""
    text = RUN_PARSER.epilog.split("Keys in the dashboard:", 1)[1].strip().rstrip(".")
    keys = set()
    for item in re.split(r"(?<=\w), ", text):  # ``zoom, , . cursor``: the comma key is an item's first word
        for word in item.split():
            if len(word) > 1 and word != "space":
                break
            keys.add(word)
    return keys


def test_the_help_epilog_names_only_bound_keys():
    assert {"space", "c", ",", "?"} <= epilog_keys()
    unbound = epilog_keys() - help_keys()
    assert not unbound, f"`ptdash --help` names keys that are not bound: {sorted(unbound)}"


# ----------------------------------------------------------------- the two commands


def marked_command(name: str) -> str:
    """The command between ``<!-- name -->`` markers, read as ``.ci/run`` reads the test command."""
    text = _text(README)
    block = text[text.index(f"<!-- {name} -->"):text.index(f"<!-- /{name} -->")]
    lines = [line for line in block.splitlines()[1:] if line and not line.startswith(("<!--", "```"))]
    assert len(lines) == 1, f"the {name} block holds one line, not {lines}"
    return lines[0]


def test_ci_reads_the_test_command_from_its_markers():
    ci = _text(ROOT / ".ci" / "run")
    assert "<!-- test-command -->" in ci and "<!-- \\/test-command -->" in ci
    assert "pytest" in marked_command("test-command")


def _pyproject() -> dict:
    return tomllib.loads(_text(ROOT / "pyproject.toml"))


def _torch_pin(command: str) -> tuple[int, ...]:
    pin = re.search(r"torch==([\d.]+)", command)
    assert pin, f"no pinned torch in {command!r}"
    return tuple(int(x) for x in pin.group(1).split("."))


def test_the_two_commands_install_what_pyproject_declares():
    project = _pyproject()["project"]
    least = next(d for d in project["dependencies"] if d.startswith("torch"))
    floor = tuple(int(x) for x in least.split(">=")[1].split("."))
    demo, tests = marked_command("demo-command"), marked_command("test-command")
    assert _torch_pin(demo) == _torch_pin(tests) >= floor
    assert "pip install -e ." in demo
    extras = re.findall(r"-e '\.\[(\w+)\]'", tests)
    assert extras and all(e in project["optional-dependencies"] for e in extras)
    test_deps = " ".join(project["optional-dependencies"]["test"])
    if re.search(r"pytest .*-n \d", tests):
        assert "pytest-xdist" in test_deps, "the test command runs pytest -n, which needs pytest-xdist"


def test_the_demo_command_runs_the_demo_subcommand():
    words = marked_command("demo-command").split("bin/ptdash", 1)[1].split()
    first = cli._first_positional(words)
    assert first is not None and words[first] == "demo" and "demo" in cli.SUBCOMMANDS
    assert _pyproject()["project"]["scripts"]["ptdash"] == "ptdash.tui.cli:main"


# -------------------------------------------------------------------- pages, links


def test_the_readme_is_a_short_page():
    lines = _text(README).count("\n")
    assert lines <= 300, f"README.md is {lines} lines; the depth goes to docs/ (the limit is 300)"


def test_the_readme_links_every_docs_page():
    more = _section(_text(README), "## More")
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)\)", more))
    assert DOCS, "docs/ is empty"
    missing = {f"docs/{p.name}" for p in DOCS} - linked
    assert not missing, f"docs pages not in the README's More list: {sorted(missing)}"
    assert "benchmarks/README.md" in more


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        _, prose = _fenced(_text(page))
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"\w+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md":
                anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", _fenced(_text(dest))[1], re.M)}
                if anchor not in anchors:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
