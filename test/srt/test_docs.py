"""The docs against the code (CPU only).

What a user reads must name only what exists and say only what the code does:

- every module or file path of this repository a doc names (``python/sglang_ddtree/...``,
  ``sglang_ddtree.x.y``, ``core/x.py``, ``benchmark/ddtree/x.py``, ...) exists;
- every ``--speculative-*`` flag is this plugin's or pristine SGLang 0.5.17's, and every flag
  given to one of this repository's entry points (``python -m sglang_ddtree.x``,
  ``benchmark/ddtree/x.py``, ``upstream/x.py``, ``client.py``) is one that entry point defines;
- every ``SGLANG_DDTREE_*`` variable is declared in ``srt/ddtree_envs.py`` (serving) or
  ``benchmark/ddtree/instruments.py`` (the benchmarks' instruments), or read by the code;
- every "`is_x()` returns True / False" claim matches ``DDTreeSpecAlgo``'s answer;
- measured ratios and timings appear only in ``benchmark/ddtree/RESULTS.md``; the other docs
  link its sections, and every such link resolves;
- RESULTS.md stays a report (at most 400 lines, no run or issue numbers, its K2.6 table equal
  to what ``plot_per_user.py`` reads), ``docs/limits.md`` at most 60 lines, and
  ``benchmark/ddtree/results/`` holds exactly the folders RESULTS.md cites (or a test reads);
- the README's first request is runnable as written and its terms come before their use.

Each checker is a function the calibration tests below feed a made-up flag, module, variable,
``is_*`` claim and repeated number, and each is caught.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
import shlex
from pathlib import Path

from conftest import top_level_names

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "python" / "sglang_ddtree"
RESULTS = ROOT / "benchmark" / "ddtree" / "RESULTS.md"
LIMITS = ROOT / "docs" / "limits.md"
README = ROOT / "README.md"


def user_docs() -> list[Path]:
    """The docs a user reads besides RESULTS.md."""
    return [
        README,
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "docker").rglob("README.md")),
        ROOT / "upstream" / "README.md",
    ]


def all_docs() -> list[Path]:
    return [*user_docs(), RESULTS]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- the code's names ---------------------------------------------------------------------------


def code_files() -> list[Path]:
    return [
        *sorted(PKG.rglob("*.py")),
        *sorted((ROOT / "upstream").glob("*.py")),
        *sorted((ROOT / "benchmark" / "ddtree").glob("*.py")),
        *sorted((ROOT / "docker").rglob("*.py")),
    ]


def _docstring_ids(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def code_strings(path: Path) -> set[str]:
    """String constants of ``path`` that are not docstrings."""
    tree = ast.parse(path.read_text())
    skip = _docstring_ids(tree)
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
    }


def defined_flags(path: Path) -> set[str]:
    """The option strings of every ``add_argument`` call in ``path``."""
    flags = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("--"):
                    flags.add(arg.value)
    return flags


def plugin_flags() -> set[str]:
    return set().union(*(defined_flags(p) for p in sorted(PKG.rglob("*.py"))))


def env_names() -> set[str]:
    """``SGLANG_DDTREE_*`` names the code declares (the knobs) or reads (string constants)."""
    names = set()
    for declared in (PKG / "srt" / "ddtree_envs.py", ROOT / "benchmark/ddtree/instruments.py"):
        for node in ast.walk(ast.parse(declared.read_text())):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                if getattr(node.value.func, "id", None) == "Knob":
                    names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    for path in code_files():
        names |= {s for s in code_strings(path) if ENV.fullmatch(s)}
    return names


def spec_predicates() -> dict[str, bool]:
    """``DDTreeSpecAlgo``'s ``is_*`` methods that return a constant: name -> value."""
    tree = ast.parse((PKG / "srt" / "ddtree_spec.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DDTreeSpecAlgo"]
    answers = {}
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith("is_"):
            last = fn.body[-1]
            if isinstance(last, ast.Return) and isinstance(last.value, ast.Constant):
                answers[fn.name] = last.value.value
    return answers


def sglang_flags(source) -> set[str]:
    """Pristine SGLang 0.5.17's server flags: one per ``ServerArgs`` field, and every option
    string of its argument code (``server_args.py``, ``arg_groups/``)."""
    flags = set()
    paths = ["python/sglang/srt/server_args.py"]
    paths += [p for p in source.python_files("python/sglang/srt/arg_groups/")]
    for path in paths:
        tree = ast.parse(source.read(path).decode())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        flags.add("--" + item.target.id.replace("_", "-"))
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.fullmatch(r"--[a-z][a-z0-9-]+", node.value):
                    flags.add(node.value)
    return flags


# --- paths and modules --------------------------------------------------------------------------

PATH = re.compile(
    r"(?<![\w./-])((?:python/sglang_ddtree|sglang_ddtree|sgl-kernel|benchmark/ddtree|test/srt|"
    r"docker|upstream|core|srt|testing|pair)/[\w./{},*-]*[\w}*/])"
)
DOTTED = re.compile(r"(?<![\w.])sglang_ddtree(?:\.\w+)+")
SHORT_ROOTS = {"sglang_ddtree": "python/sglang_ddtree", **{
    d: f"python/sglang_ddtree/{d}" for d in ("core", "srt", "testing", "pair")}}  # fmt: skip


def _expand(path: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return list(
        itertools.chain.from_iterable(
            _expand(path[: m.start()] + alt + path[m.end() :]) for alt in m.group(1).split(",")
        )
    )


def missing_paths(text: str) -> list[str]:
    """Repository paths ``text`` names that do not exist (placeholders with ``<`` skipped)."""
    missing = []
    for m in PATH.finditer(text):
        raw = m.group(1)
        if "<" in raw or "NN" in raw:
            continue
        head, _, rest = raw.partition("/")
        base = SHORT_ROOTS.get(head, head) if head != "python" else "python"
        for one in _expand(rest.rstrip("/.")):
            path = f"{base}/{one}" if one else base
            hits = list(ROOT.glob(path)) if "*" in path else [ROOT / path]
            if not hits or not all(h.exists() for h in hits):
                missing.append(raw)
    for m in DOTTED.finditer(text):
        if not _module_exists(m.group(0).split(".")[1:]):
            missing.append(m.group(0))
    return missing


def _module_exists(parts: list[str]) -> bool:
    here = PKG
    for i, part in enumerate(parts):
        if (here / part).is_dir():
            here = here / part
            continue
        module = here / f"{part}.py"
        if not module.exists():
            return False
        attrs = parts[i + 1 :]
        return not attrs or attrs[0] in top_level_names(module.read_text())
    return True


# --- flags --------------------------------------------------------------------------------------

SPEC_FLAG = re.compile(r"(?<![\w-])--speculative-[a-z0-9-]*[a-z0-9](?![\w*-])")
FLAG = re.compile(r"(?<![\w=-])--[a-z][a-z0-9-]*[a-z0-9](?![\w*-])")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
ENTRY = re.compile(
    r"(?:-m\s+(sglang_ddtree(?:\.\w+)+)|(?<![\w.])((?:[\w-]+/)*[\w-]+\.py)(?![\w.]))"
)
PASSTHROUGH = {"sglang_ddtree.serve"}  # unknown arguments go on to sglang.launch_server


def commands(text: str) -> list[str]:
    """Command lines of ``text``: fenced blocks' lines (``\\`` continuations joined) and
    inline code spans."""
    out = []
    for block in FENCE.findall(text):
        out += block.replace("\\\n", " ").splitlines()
    prose = FENCE.sub("", text)
    out += INLINE.findall(prose)
    return out


def entry_file(token: re.Match) -> tuple[str, Path] | None:
    """(name, source file) of the entry point a command runs, or None if not ours."""
    module, script = token.group(1), token.group(2)
    if module:
        path = PKG.joinpath(*module.split(".")[1:])
        path = path / "__main__.py" if path.is_dir() else path.with_suffix(".py")
        return (module, path) if path.exists() else (module, Path("/nonexistent"))
    name = Path(script).name
    for folder in ("benchmark/ddtree", "upstream", "docker/kimi-k2.6"):
        path = ROOT / folder / name
        if path.exists() and (script == name or script.endswith(f"{folder}/{name}")):
            return script, path
    return None


def unknown_flags(text: str, sglang: set[str] | None) -> list[str]:
    """Flags ``text`` names that nothing defines. ``sglang``: pristine SGLang's flags, or None
    where its sources are unavailable (then only this repository's flags are judged)."""
    bad = []
    ours = plugin_flags()
    for flag in set(SPEC_FLAG.findall(text)):
        if flag in ours or (sglang is None and not flag.startswith("--speculative-ddtree")):
            continue
        if sglang is None or flag not in sglang:
            bad.append(flag)
    for line in commands(text):
        line = line.split(" #")[0]
        for token in ENTRY.finditer(line):
            found = entry_file(token)
            if found is None:
                continue
            name, path = found
            rest = re.split(r"\||;|&&|>", line[token.end() :])[0]
            rest = re.sub(r"=\S+", "", rest)  # --server-args=--x: a value, not a flag
            allowed = defined_flags(path) if path.exists() else set()
            for flag in FLAG.findall(rest):
                if flag in allowed:
                    continue
                if name in PASSTHROUGH and (sglang is None or flag in sglang):
                    continue
                bad.append(f"{name} {flag}")
            break
    return bad


# --- environment variables ----------------------------------------------------------------------

ENV = re.compile(r"SGLANG_DDTREE_[A-Z0-9_]*[A-Z0-9]")


def unknown_env(text: str, known: set[str]) -> list[str]:
    return sorted(set(ENV.findall(text)) - known)


# --- is_* claims --------------------------------------------------------------------------------

CLAIM = re.compile(r"`(?:\w+\.)*(is_\w+)\(\)`")


def claims(text: str) -> list[tuple[str, bool]]:
    """("is_x", value) for every "`is_x()` ... True/False" in ``text``: the first True or False
    after a predicate, within its sentence and before the next predicate; predicates joined by
    "and" / "," share the value that follows the last of them."""
    text = " ".join(text.split())
    found = list(CLAIM.finditer(text))
    out, group = [], []
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        window = text[m.end() : end]
        stop = re.search(r"[.;:!?](?:\s|$)", window)
        window = window[: stop.start()] if stop else window
        group.append(m.group(1))
        value = re.search(r"\b(True|False)\b", window[:80])
        if value:
            out += [(name, value.group(1) == "True") for name in group]
            group = []
        elif not re.fullmatch(r"\s*(?:,|and|or|, and)?\s*", window):
            group = []
    return out


def wrong_claims(found: list[tuple[str, bool]], answers: dict[str, bool]) -> list[str]:
    return [
        f"{name}() is said to return {value}, the code says {answers.get(name, 'nothing')}"
        for name, value in found
        if answers.get(name) is not value
    ]


# --- numbers ------------------------------------------------------------------------------------

NUMBER = re.compile(
    r"\b\d+(?:\.\d+)?(?:\s*[-–]\s*\d+(?:\.\d+)?)?x\b(?!\s*(?:H100|H200|B300|GPU))"
    r"|\b\d+(?:[.,]\d+)?(?:\s*[-–]\s*\d+(?:[.,]\d+)?)?\s?(?:µs|us|ms)\b"
)


def measured_numbers(text: str) -> list[str]:
    """Ratios ("1.09x", "0.61-1.17x") and timings ("34 µs", "70-130 us", "13 ms") in ``text``;
    hardware counts ("8x H200") are not ratios."""
    return [m.group(0) for m in NUMBER.finditer(text) if "." in m.group(0) or m.group(0)[-1] != "x"]


# --- RESULTS.md sections ------------------------------------------------------------------------


def slug(header: str) -> str:
    """GitHub's anchor of a markdown header."""
    text = re.sub(r"[^\w\- ]", "", header.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}


# === the tests ==================================================================================


def test_named_paths_and_modules_exist():
    bad = {rel(p): missing_paths(p.read_text()) for p in all_docs()}
    assert not {k: v for k, v in bad.items() if v}


def test_named_flags_exist(source):
    known = sglang_flags(source)
    assert "--speculative-num-draft-tokens" in known and "--attention-backend" in known
    bad = {rel(p): unknown_flags(p.read_text(), known) for p in all_docs()}
    assert not {k: v for k, v in bad.items() if v}


def test_named_plugin_flags_exist_without_sglang():
    """The part of the flag check that needs no SGLang sources."""
    bad = {rel(p): unknown_flags(p.read_text(), None) for p in all_docs()}
    assert not {k: v for k, v in bad.items() if v}


def test_named_env_variables_exist():
    known = env_names()
    assert "SGLANG_DDTREE_TOPK" in known and "SGLANG_DDTREE_BUDGET_SCHEDULE" in known
    bad = {rel(p): unknown_env(p.read_text(), known) for p in all_docs()}
    assert not {k: v for k, v in bad.items() if v}


def test_is_predicate_claims_match_the_code():
    answers = spec_predicates()
    assert {"is_dflash", "is_dflash_family"} <= set(answers), "the AST reading found nothing"
    found = {rel(p): claims(p.read_text()) for p in all_docs()}
    assert found["docs/integration.md"], "the integration doc states no is_* claim any more"
    bad = {k: wrong_claims(v, answers) for k, v in found.items()}
    assert not {k: v for k, v in bad.items() if v}


def test_measured_numbers_live_in_results_only():
    bad = {rel(p): measured_numbers(p.read_text()) for p in user_docs()}
    assert not {k: v for k, v in bad.items() if v}


def test_results_links_resolve():
    targets = anchors(RESULTS)
    link = re.compile(r"\]\(([^)]*RESULTS\.md)#([^)]+)\)")
    bad = []
    for path in user_docs():
        for m in link.finditer(path.read_text()):
            if m.group(2) not in targets:
                bad.append(f"{rel(path)}: #{m.group(2)}")
            if not (path.parent / m.group(1)).resolve() == RESULTS:
                bad.append(f"{rel(path)}: {m.group(1)}")
    assert not bad


def test_no_run_or_issue_numbers():
    pattern = re.compile(r"\b(?:runs?|issues?) \d+\b|\bitem \d+\b", re.I)
    bad = {rel(p): pattern.findall(p.read_text()) for p in all_docs()}
    assert not {k: v for k, v in bad.items() if v}


def test_results_is_a_report_and_limits_is_short():
    assert len(RESULTS.read_text().splitlines()) <= 400
    assert len(LIMITS.read_text().splitlines()) <= 60
    text = RESULTS.read_text()
    assert "![" in text and (RESULTS.parent / "per_user.png").exists()
    for header in ("Kernel choices", "Not measured", "Losslessness"):
        assert f"## {header}" in text


def test_results_table_is_the_plot_s_data(load_benchmark):
    plot = load_benchmark("plot_per_user")
    lines = plot.table()
    text = RESULTS.read_text()
    assert all(line in text.splitlines() for line in lines), "rerun plot_per_user.py"


def test_results_folder_holds_what_results_cites():
    results = RESULTS.parent / "results"
    cited = set(re.findall(r"`results/([^/`]+)/?`", RESULTS.read_text()))
    assert cited and all((results / c).exists() for c in cited), cited
    read_by_tests = set()  # a path, or a folder name joined to one (``parent / "run49"``)
    for path in (ROOT / "test").rglob("*.py"):
        text = path.read_text()
        read_by_tests |= set(re.findall(r"benchmark/ddtree/results/([\w.-]+)", text))
        read_by_tests |= set(re.findall(r"[\"'](run\d+)[\"']", text)) - {"run"}
    kept = {p.name for p in results.iterdir()}
    assert kept == cited | read_by_tests, {
        "kept, not cited": sorted(kept - cited - read_by_tests),
        "cited, missing": sorted((cited | read_by_tests) - kept),
    }


def test_readme_lists_every_module():
    readme = README.read_text()
    for path in sorted((PKG / "srt").glob("ddtree_*.py")):
        assert f"`{path.name}`" in readme, path.name
    for path in sorted(PKG.iterdir()):
        if path.name.startswith("_") or path.name == "__pycache__":
            continue
        assert f"python/sglang_ddtree/{path.name}" in readme or f"`{path.name}`" in readme, path


def test_upstream_readme_names_every_mapped_module_and_part(gen):
    text = (ROOT / "upstream" / "README.md").read_text()
    for module in gen.MODULE_MAP:
        assert module.rsplit(".", 1)[-1] in text, module
    for i, part in enumerate(gen.SERIES, 1):
        name = gen.part_file_name(i, part)
        (row,) = [line for line in text.splitlines() if line.startswith(f"| `{name}`")]
        for module in part.modules:
            name = module.rsplit(".", 1)[-1]
            assert name in row or (name == "core" and "__init__" in row), (part.name, module)
        for template in part.templates:
            if template.endswith(".py"):
                assert template in row, (part.name, template)


def _readme_block(lang: str, needle: str) -> str:
    blocks = re.findall(rf"^```{lang}\n(.*?)^```", README.read_text(), re.M | re.S)
    return next(b for b in blocks if needle in b)


def test_readme_first_request_curl():
    """The block a GPU test runs as written: one curl to the served port's chat endpoint with
    a JSON body SGLang's ChatCompletionRequest reads (temperature and top_p set)."""
    block = _readme_block("bash", "/v1/chat/completions")
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[0] == "curl" and argv.count("curl") == 1
    assert "http://127.0.0.1:30000/v1/chat/completions" in argv
    body = json.loads(argv[argv.index("-d") + 1])
    assert body["messages"][0]["role"] == "user" and body["messages"][0]["content"]
    assert 0 < body["temperature"] <= 2 and 0 < body["top_p"] < 1 and body["max_tokens"] > 0
    assert isinstance(body["model"], str)


def test_readme_first_request_python():
    block = _readme_block("python", "from openai import OpenAI")
    tree = ast.parse(block)
    calls = {getattr(n.func, "attr", getattr(n.func, "id", None)): n for n in ast.walk(tree)
             if isinstance(n, ast.Call)}  # fmt: skip
    client = {k.arg: k.value.value for k in calls["OpenAI"].keywords}
    assert client == {"base_url": "http://127.0.0.1:30000/v1", "api_key": "EMPTY"}
    create = {k.arg for k in calls["create"].keywords}
    assert {"model", "messages", "temperature", "top_p"} <= create
    assert "print" in calls


def test_readme_order_terms_papers_recipe():
    text = README.read_text()
    sections = re.findall(r"^## (.+)$", text, re.M)
    assert sections[:2] == ["Set up", "First request"], sections
    assert "arxiv.org/abs/2604.12989" in text and "arxiv.org/abs/2602.06036" in text
    terms_start = text.index("- **block B**")
    for term in ("bonus token", "law", "MLA", "Gluon", "ancestor block", "node", "W "):
        first = re.search(rf"(?<![\w-]){re.escape(term)}", text)
        assert first and first.start() >= terms_start, term
    recipe = text[text.index("docker/kimi-k2.6/") - 200 :][:600]
    assert "not been built or run" in recipe


# --- calibration: each checker catches a made-up name, claim or number --------------------------


def test_a_made_up_path_or_module_is_caught():
    assert missing_paths("`python/sglang_ddtree/srt/ddtree_nope.py`") == [
        "python/sglang_ddtree/srt/ddtree_nope.py"
    ]
    assert missing_paths("`core/{tree,nope}.py`") == ["core/{tree,nope}.py"]
    assert missing_paths("`sglang_ddtree.testing.nope`") == ["sglang_ddtree.testing.nope"]
    assert missing_paths("`sglang_ddtree.testing.e2e.nope`") == ["sglang_ddtree.testing.e2e.nope"]
    assert missing_paths("`srt/ddtree_spec.py`, `sglang_ddtree.testing.e2e`") == []


def test_a_made_up_flag_is_caught():
    sglang = {"--speculative-num-draft-tokens", "--port"}
    assert unknown_flags("`--speculative-ddtree-nope 3`", None) == ["--speculative-ddtree-nope"]
    assert unknown_flags("`--speculative-nope`", sglang) == ["--speculative-nope"]
    assert unknown_flags("`--speculative-ddtree-topk 8`", sglang) == []
    text = "```bash\npython -m sglang_ddtree.testing.law --dtype float16 \\\n    --no-such 1\n```"
    assert unknown_flags(text, sglang) == ["sglang_ddtree.testing.law --no-such"]
    assert unknown_flags("`bench_step.py --model kimi --nope`", sglang) == ["bench_step.py --nope"]
    assert unknown_flags("`python -m sglang_ddtree.serve --pair --port 30000`", sglang) == []
    assert unknown_flags("`python -m sglang_ddtree.serve --bogus`", sglang) == [
        "sglang_ddtree.serve --bogus"
    ]


def test_a_made_up_env_variable_is_caught():
    known = env_names()
    assert unknown_env("`SGLANG_DDTREE_NOPE=1`, `SGLANG_DDTREE_TOPK`", known) == [
        "SGLANG_DDTREE_NOPE"
    ]


def test_claims_are_read_and_a_wrong_one_is_caught():
    answers = spec_predicates()
    assert claims("`X.is_dflash()` and `is_dflash_family()` return True, so") == [
        ("is_dflash", True),
        ("is_dflash_family", True),
    ]
    right = claims("answers `is_dflash_family()` True and `is_dflash()` False: every branch")
    assert right == [("is_dflash_family", True), ("is_dflash", False)]
    assert wrong_claims(right, answers) == []
    assert wrong_claims(claims("`is_dflash()` returns True."), answers)
    assert wrong_claims(claims("`is_eagle()` returns False."), answers)
    assert claims("a call of `is_dflash()` in the scheduler. Nothing else is True.") == []


def test_a_repeated_number_is_caught():
    assert measured_numbers("at W 8-32 0.61-1.17x FlashMLA's, 70-130 us, 1.09x, 34 µs") == [
        "0.61-1.17x",
        "70-130 us",
        "1.09x",
        "34 µs",
    ]
    assert measured_numbers("on 8x H200 or 8 x B300, 3x the tiles") == []
