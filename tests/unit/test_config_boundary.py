"""The config boundary (issue 39): the launch step (launchspec.resolve) turns the LaunchConfig once into narrow
specs, and no module below it imports trainrun.cli or trainrun.config (LaunchConfig's module) or names
LaunchConfig, not even for an annotation under `if TYPE_CHECKING:`. The layers are read from docs/architecture.md, as tests/unit/test_layering.py reads them."""
from __future__ import annotations

import ast

from test_layering import DOC, PACKAGE, module_names, read_layers, unit_of

ABOVE_THE_BOUNDARY = ("entry points", "run a function", "horovodrun", "command", "launch")


def test_no_module_below_the_launch_step_sees_the_launch_config():
    layers = read_layers(DOC.read_text())
    names = [layer for layer, _, _ in layers]
    assert set(ABOVE_THE_BOUNDARY) <= set(names), names
    units = {u: layer for layer, _, us in layers for u in us}
    problems = []
    for name, path in module_names(PACKAGE).items():
        unit = unit_of(name, list(units))
        if unit is None or units[unit] in ABOVE_THE_BOUNDARY or name.startswith("cli") or name == "config":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module]
            problems += [f"{name}:{node.lineno} imports {t}" for t in targets
                         if t in ("trainrun.cli", "trainrun.config") or t.startswith("trainrun.cli.")]
        problems += [f"{name}: names LaunchConfig" for n in ast.walk(tree)
                     if isinstance(n, ast.Name) and n.id == "LaunchConfig"][:1]
    assert not problems, "\n".join(problems)


def test_the_launch_spec_is_made_once_and_every_mode_reads_its_parts():
    """resolve() runs -x's lookup and builds the elastic settings once; the Job of every mode takes its
    Supervision (assemble.supervised: a static job, each attempt, mpirun's)."""
    from trainrun.config import parse_config
    from trainrun.launchspec import resolve
    from trainrun.supervisor.assemble import supervised
    from trainrun.supervisor.output import OutputSink
    from trainrun.supervisor.supervision import AGENT_START_SLACK

    cfg = parse_config(("x",), num_proc=2, export=("A",), grace=1.5, hang_timeout=4.0, start_timeout=6.0,
                       ssh_timeout=7.0, max_restarts=2)
    spec = resolve(cfg, {"A": "from-the-launcher"})
    assert dict(spec.plan.exports)["A"] == "from-the-launcher"
    assert spec.elastic is not None and spec.elastic.max_restarts == 2
    sup = spec.supervision
    assert (sup.grace, sup.hang_timeout, sup.start_timeout, sup.host_answer) == (1.5, 4.0, 6.0, 7.0 + AGENT_START_SLACK)
    assert resolve(parse_config(("x",), num_proc=1), {}).supervision.start_timeout == 120.0  # the one default
    from trainrun.plan.envcontract import JobInfo
    from trainrun.plan.spec import LaunchPlan

    job = supervised(LaunchPlan(JobInfo("j", "127.0.0.1", 1), ()), OutputSink(), [], sup, spec.output)
    assert (job.grace, job.start_timeout, job.hang_timeout) == (1.5, 6.0, 4.0)
