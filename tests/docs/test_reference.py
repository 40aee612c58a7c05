"""The generated reference pages against the code: every option of `trainrun` and `horovodrun`, every environment
variable trainrun sets or reads, every exit code of errors.py is in them, and each with a description. The
pages are generated from the code (scripts/docsgen.py, a hook of `mkdocs build`); these tests fail when
something exists in the code and not in the docs, or when a page no longer asks for its generated part."""
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def load_docsgen():
    spec = importlib.util.spec_from_file_location("docsgen", REPO / "scripts" / "docsgen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


docsgen = load_docsgen()


def markers() -> dict[str, list[str]]:
    """generated part -> the pages that ask for it."""
    out: dict[str, list[str]] = {}
    for page in DOCS.rglob("*.md"):
        for name in docsgen.MARKER.findall(page.read_text()):
            out.setdefault(name, []).append(str(page.relative_to(DOCS)))
    return out


def test_every_generated_part_is_on_a_page_and_every_marker_is_known():
    found = markers()
    assert set(found) <= set(docsgen.RENDER), set(found) - set(docsgen.RENDER)
    assert set(docsgen.RENDER) <= set(found), f"generated parts no page shows: {set(docsgen.RENDER) - set(found)}"


@pytest.fixture(scope="module")
def trainrun_page():
    return docsgen.expand((DOCS / "reference" / "trainrun-cli.md").read_text())


def test_every_trainrun_option_is_in_the_reference_with_type_default_and_help(trainrun_page):
    import click

    from trainrun.cli.command import cli

    ctx = click.Context(cli, info_name="trainrun")
    options = [p for p in cli.get_params(ctx) if isinstance(p, click.Option)]
    assert len(options) > 40
    rows = {line.split(" | ")[0]: line for line in trainrun_page.splitlines() if line.startswith("| `")}
    for p in options:
        row = next((r for k, r in rows.items() if f"`{p.opts[-1]}`" in k), None)
        assert row is not None, f"trainrun {p.opts[-1]} is not in docs/reference/trainrun-cli.md"
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[1], f"{p.opts[-1]}: no type"
        assert cells[3] and p.help and cells[3][:20] == p.help.replace("|", "\\|")[:20], f"{p.opts[-1]}: help differs"
        default = p.default
        if isinstance(default, (int, float, str)) and not isinstance(default, bool) and default != "":
            assert f"`{default}`" in cells[2], f"{p.opts[-1]}: default {default!r} not shown ({cells[2]!r})"
    assert "`--start-timeout` | S: number x>0 | `120`" in trainrun_page  # a default from the help's [default: ...]


def test_every_horovodrun_option_is_in_the_reference_with_its_outcome():
    from trainrun.horovodrun.options import build_parser

    page = docsgen.expand((DOCS / "reference" / "horovodrun-cli.md").read_text())
    for action in build_parser()._actions:
        for opt in action.option_strings:
            assert f"`{opt}`" in page, f"horovodrun {opt} is not in docs/reference/horovodrun-cli.md"
    outcomes = re.findall(r"^\| `.*? \| (done|noted|refused) \| .+ \|$", page, re.M)
    assert len(outcomes) == len([a for a in build_parser()._actions if a.option_strings])
    assert "| `--jsrun` | flag | refused |" in page and "| `--cycle-time-ms` | number | noted |" in page
    assert "HOROVOD_FUSION_THRESHOLD=" in page


def variables_in_code() -> dict[str, list[str]]:
    """Every TRAINRUN_*/HOROVOD_* token in launcher/trainrun/ -> the files that name it."""
    out: dict[str, list[str]] = {}
    for path in (REPO / "launcher" / "trainrun").rglob("*.py"):
        for name in set(re.findall(r"\b((?:TRAINRUN|HOROVOD)_[A-Z0-9_]*[A-Z0-9_])", path.read_text())):
            out.setdefault(name, []).append(str(path.relative_to(REPO)))
    return out


def covered(name: str, documented: set[str]) -> bool:
    """`name` is documented, or under a documented prefix (HOROVOD_GLOO_ covers HOROVOD_GLOO_IFACE); a prefix in the
    code (HOROVOD_LOCAL_) is covered by the documented names it starts (HOROVOD_LOCAL_RANK)."""
    return name in documented or any(d.endswith("_") and name.startswith(d) for d in documented) or \
        (name.endswith("_") and any(d.startswith(name) for d in documented))


def test_every_variable_in_the_code_is_in_the_environment_reference_with_a_description():
    from trainrun.horovod_no_effect import NO_EFFECT

    documented = set(docsgen.ENV) | set(NO_EFFECT)
    missing = {n: files for n, files in variables_in_code().items()
               if not covered(n, documented) and n not in docsgen.NOT_VARIABLES}
    assert not missing, ("variables in the code with no line in scripts/docsgen.py ENV (the environment reference): "
                         + "; ".join(f"{n} ({', '.join(f)})" for n, f in sorted(missing.items())))
    page = docsgen.expand((DOCS / "reference" / "environment.md").read_text())
    for name in docsgen.ENV:
        shown = name + "<i>" if name.endswith("_") else name
        assert f"`{shown}`" in page, name
    for name in NO_EFFECT:
        assert f"`{name}*`" in page if name.endswith("_") else f"`{name}`" in page, name
    assert all(d.strip() for _, d in docsgen.ENV.values())


def test_the_contract_and_the_settings_reader_are_in_the_reference():
    contract = docsgen.contract_names()
    assert {"RANK", "WORLD_SIZE", "MASTER_ADDR", "TRAINRUN_JOB_ID", "TF_CONFIG", "SLURM_PROCID"} <= set(contract)
    assert [n for n in contract if docsgen.ENV.get(n, ("",))[0] != "contract"] == [], \
        "rank_env sets a variable that the reference's contract table does not list"
    from trainrun.horovod_no_effect import NO_EFFECT

    settings = docsgen.settings_names()
    assert "TRAINRUN_STALL_TIMEOUT" in settings and "HOROVOD_FUSION_THRESHOLD" in settings
    assert [n for n in settings if not covered(n, set(docsgen.ENV) | set(NO_EFFECT))] == []


def test_a_new_variable_would_fail_the_check():
    assert not covered("TRAINRUN_SOMETHING_NEW", set(docsgen.ENV))
    assert covered("TRAINRUN_RUN_PIECE_3", set(docsgen.ENV)) and covered("HOROVOD_GLOO_IFACE", {"HOROVOD_GLOO_"})


def test_exit_codes_page_has_every_code_of_errors_py():
    page = docsgen.expand((DOCS / "reference" / "exit-codes.md").read_text())
    table = page[:page.index("## From the code")]
    codes = {c for c, _ in docsgen.errors_doc_codes()} | {str(c.exit_code) for c in docsgen.error_classes() if c.exit_code != 1}
    assert {"2", "3", "4", "124", "126", "127"} <= codes
    for code in codes:
        assert re.search(rf"^\| [^|]*\b{code}\b[^|]* \|", table, re.M), f"exit code {code} (errors.py) not in the table"
    for cls in docsgen.error_classes():
        assert f"`{cls.__name__}`" in page


def test_horovod_api_lists_come_from_the_public_name_tests():
    torch_names = docsgen.horovod_names("tests/runtime/test_torch_api.py", ("HOROVOD_TORCH",))
    assert "DistributedOptimizer" in torch_names and len(torch_names) > 50
    for _, _, test_file, variables, _ in docsgen.NAME_LISTS:
        assert docsgen.horovod_names(test_file, variables), (test_file, variables)
