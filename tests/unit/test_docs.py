"""The README stays short and every documentation link leads somewhere (issue 37, item 1).

README.md is the front page: at most 200 lines, no line over 200 characters, and the A6000 deploy
command on its first screen. Everything else lives in docs/, and every relative link in README.md
and docs/*.md must resolve: to a file that exists and, for `page.md#anchor`, to a heading of that
page under GitHub's slug rules (lowercase; spaces become '-'; punctuation other than '-' and '_'
dropped; a repeated heading gets '-1', '-2', ...). Each check is a function, shown failing on a
broken input before it is run on the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
A6000_DEPLOY = "ansible-playbook deploy.yml -l a6000"
MAX_README_LINES = 200
DEPLOY_WITHIN = 60
MAX_LINE_CHARS = 200

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_LINK_TEXT = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    lines, fenced = [], None
    for number, line in enumerate(text.splitlines(), 1):
        fence = _FENCE.match(line)
        if fence:
            if fenced is None:
                fenced = fence.group(1)
            elif fence.group(1) == fenced:
                fenced = None
            continue
        if fenced is None:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: links reduced to their text, lowercase, every
    character but letters, digits, spaces, '-' and '_' dropped, spaces to '-'."""
    text = _INLINE_LINK_TEXT.sub(r"\1", heading).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor in a markdown text (repeats numbered as GitHub numbers them)."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in _prose_lines(text):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    found |= set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    return found


def broken_links(page: Path) -> list[str]:
    """Each relative link of a markdown page that leads nowhere: 'page:line: target (why)'."""
    problems = []
    for number, line in _prose_lines(page.read_text(encoding="utf-8")):
        for target in _LINK.findall(_CODE_SPAN.sub("", line)):
            if _SCHEME.match(target):
                continue
            path_part, _, anchor = target.partition("#")
            where = (page.parent / path_part).resolve() if path_part else page
            if not where.exists():
                problems.append(f"{page.name}:{number}: {target} (no such file)")
                continue
            markdown = where.suffix == ".md" and where.is_file()
            if anchor and markdown and anchor not in anchors(where.read_text(encoding="utf-8")):
                problems.append(f"{page.name}:{number}: {target} (no heading #{anchor} in {where.name})")
    return problems


def readme_problems(readme: Path) -> list[str]:
    """What keeps a README from being the front page: too long, or the A6000 deploy command not
    within its first lines."""
    lines = readme.read_text(encoding="utf-8").splitlines()
    problems = []
    if len(lines) > MAX_README_LINES:
        problems.append(f"{len(lines)} lines, more than {MAX_README_LINES}")
    if not any(A6000_DEPLOY in line for line in lines[:DEPLOY_WITHIN]):
        problems.append(f"`{A6000_DEPLOY}` is not within the first {DEPLOY_WITHIN} lines")
    return problems


def long_lines(page: Path) -> list[str]:
    """Each line over MAX_LINE_CHARS characters: 'page:line: N characters'."""
    return [
        f"{page.name}:{number}: {len(line)} characters"
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > MAX_LINE_CHARS
    ]


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


# The checks, shown to fail on broken input.


def test_a_long_readme_or_one_without_the_a6000_command_near_the_top_is_caught(tmp_path: Path) -> None:
    long = tmp_path / "README.md"
    long.write_text("".join(f"line {n}\n" for n in range(59)) + f"{A6000_DEPLOY}\n" + "x\n" * 141)
    assert readme_problems(long) == [f"201 lines, more than {MAX_README_LINES}"]
    late = tmp_path / "late.md"
    late.write_text("x\n" * 60 + f"{A6000_DEPLOY}\n")
    assert readme_problems(late) == [f"`{A6000_DEPLOY}` is not within the first {DEPLOY_WITHIN} lines"]
    short = tmp_path / "short.md"
    short.write_text("x\n" * 59 + f"`{A6000_DEPLOY}`\n")
    assert readme_problems(short) == []


def test_a_link_to_a_missing_file_or_heading_is_caught_and_code_and_urls_are_not_links(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "gate.md").write_text(
        "# The gate\n\n## `specdeploy gate`: the deploy's verdict\n\n## Exit codes\n\n## Exit codes\n"
        "```\n# not a heading\n```\n"
    )
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/gate.md) [ok](docs/gate.md#specdeploy-gate-the-deploys-verdict) [ok](docs/gate.md#exit-codes-1)\n"
        "[ok](#top-heading) [ok](docs/) [ok](https://example.com/x.md#nowhere) `[code](missing.md)`\n"
        "# Top heading\n"
        "[gone](docs/moved.md) [bad anchor](docs/gate.md#watching-after-the-deploy)\n"
        "[fenced heading](docs/gate.md#not-a-heading) [self](#nothing-here)\n"
        "```\n[in a code block](missing.md)\n```\n"
    )
    assert broken_links(page) == [
        "README.md:4: docs/moved.md (no such file)",
        "README.md:4: docs/gate.md#watching-after-the-deploy (no heading #watching-after-the-deploy in gate.md)",
        "README.md:5: docs/gate.md#not-a-heading (no heading #not-a-heading in gate.md)",
        "README.md:5: #nothing-here (no heading #nothing-here in README.md)",
    ]


def test_github_slugs_drop_punctuation_but_keep_hyphens_and_underscores() -> None:
    assert slug("`specdeploy gate`: the deploy's verdict") == "specdeploy-gate-the-deploys-verdict"
    assert slug("Profiles: the single source of truth") == "profiles-the-single-source-of-truth"
    assert slug("The profile's `front:` section") == "the-profiles-front-section"
    assert slug("vllm-stock") == "vllm-stock"
    assert slug("snake_case and [a link](x.md)") == "snake_case-and-a-link"


def test_a_line_over_200_characters_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "README.md"
    page.write_text("short\n" + "x" * 200 + "\n" + "y" * 201 + "\n")
    assert long_lines(page) == ["README.md:3: 201 characters"]


# The checks on the repository.


def test_the_readme_is_at_most_200_lines_with_the_a6000_deploy_command_in_its_first_60() -> None:
    assert readme_problems(ROOT / "README.md") == []


def test_every_relative_link_in_the_readme_and_docs_resolves_to_a_file_and_heading() -> None:
    pages = _pages()
    assert len(pages) > 5
    problems = [problem for page in pages for problem in broken_links(page)]
    assert problems == [], "\n".join(problems)


def test_no_readme_line_is_over_200_characters() -> None:
    assert long_lines(ROOT / "README.md") == []
