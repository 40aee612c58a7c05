"""The command line as a user meets it: --version, --help, --dry-run, --config, and every bad input as one
error line with its exit code (2 for usage, 126/127 for the program) and no traceback."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from launch_helpers import assert_one_line_error, base_env, worker

pytestmark = pytest.mark.timeout(60)


def test_version(run_trainrun):
    from trainrun.version import __version__

    run = run_trainrun("--version")
    assert run.rc == 0
    assert run.stdout.strip() == f"trainrun, version {__version__}"


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_shows_options_and_examples(run_trainrun, flag):
    run = run_trainrun(flag)
    assert run.rc == 0 and run.stderr == ""
    for needle in ("-np", "--hosts", "--hostfile", "--dry-run", "--config", "--grace", "Examples:",
                   "trainrun -np 4 train.py", "passed to it untouched"):
        assert needle in run.stdout, needle


def test_console_script_and_module_agree(tmp_path):
    script = Path(sys.executable).with_name("trainrun")
    if not script.exists():
        pytest.skip("no trainrun console script next to the interpreter")
    a = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=20)
    b = subprocess.run([sys.executable, "-m", "trainrun", "--version"], capture_output=True, text=True, timeout=20)
    assert a.returncode == b.returncode == 0
    assert a.stdout == b.stdout


def test_module_runs_a_job(run_trainrun):
    run = run_trainrun("-np", 2, "--prefix", "none", sys.executable, "-c", "import os; print(os.environ['RANK'])")
    assert run.rc == 0, run.stderr
    assert sorted(run.stdout.split()) == ["0", "1"]


# --dry-run

def test_dry_run_table_launches_nothing(run_trainrun, tmp_path):
    marker = tmp_path / "created"
    run = run_trainrun("--dry-run", "-H", "localhost:2,127.0.0.1:1", worker("touch.py"), marker)
    assert run.rc == 0, run.stderr
    assert not marker.exists(), "--dry-run started a rank"
    lines = run.stdout.splitlines()
    header = lines[0].split()
    assert header[:2] == ["RANK", "HOST"] and "COMMAND" in header
    rows = [line.split() for line in lines[1:4]]
    assert [r[0] for r in rows] == ["0", "1", "2"]
    assert [r[1] for r in rows] == ["localhost", "localhost", "127.0.0.1"]
    assert all(sys.executable in line and worker("touch.py") in line for line in lines[1:4])
    assert "3 rank(s) on 2 host(s)" in run.stdout
    assert "RANK=0" in run.stdout and "MASTER_PORT=" in run.stdout


def test_dry_run_json(run_trainrun, tmp_path):
    marker = tmp_path / "created"
    run = run_trainrun("--dry-run", "--json", "-np", 2, "-x", "FOO=bar", "-x", "API_TOKEN=hunter2",
                       worker("touch.py"), marker, "--flag")
    assert run.rc == 0, run.stderr
    assert not marker.exists()
    doc = json.loads(run.stdout)
    assert doc["master_addr"] == "127.0.0.1" and int(doc["master_port"]) > 0 and doc["job_id"]
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for r in doc["ranks"]:
        assert r["argv"] == [sys.executable, worker("touch.py"), str(marker), "--flag"]
        assert r["host"] == "localhost" and r["local_size"] == 2 and r["nnodes"] == 1
        assert r["env"]["RANK"] == str(r["rank"]) and r["env"]["WORLD_SIZE"] == "2"
        assert r["env"]["FOO"] == "bar"
        assert r["env"]["API_TOKEN"] != "hunter2", "secrets must not be printed"
        assert r["cwd"] == str(tmp_path)
    assert "hunter2" not in run.stdout


def test_dry_run_creates_no_output_dir(run_trainrun, tmp_path):
    run = run_trainrun("--dry-run", "-np", 1, "--output-dir", tmp_path / "logs", "true")
    assert run.rc == 0, run.stderr
    assert not (tmp_path / "logs").exists()


def test_json_with_a_launch_is_accepted(run_trainrun):
    """--json goes with a launch too (the straggler events become JSON lines: tests/process/test_monitor_launch.py),
    not only with --dry-run/--check: the launch runs and ends as without it."""
    r = run_trainrun("--json", "-np", 1, "true")
    assert r.rc == 0 and b"error" not in r.err, r.err


def test_dry_run_still_checks_inputs(run_trainrun):
    assert_one_line_error(run_trainrun("--dry-run", "-H", "localhost:1", "-np", 2, "true"), 2, "--oversubscribe")
    assert_one_line_error(run_trainrun("--dry-run", "-np", 1, "no-such-program-zz"), 127, "no-such-program-zz")


# --config

def write(tmp_path, name, text) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_config_sets_options(run_trainrun, tmp_path):
    cfg = write(tmp_path, "run.yaml", "np: 3\nprefix: none\nx:\n  - FROM_CONFIG=yes\noutput-dir: logs\n")
    run = run_trainrun("--config", cfg, sys.executable, "-c", "import os; print(os.environ['RANK'], os.environ['FROM_CONFIG'])")
    assert run.rc == 0, run.stderr
    assert sorted(run.stdout.splitlines()) == ["0 yes", "1 yes", "2 yes"]
    assert (tmp_path / "logs" / "rank.2" / "stdout").read_text() == "2 yes\n"


def test_config_hosts_list_and_underscore_keys(run_trainrun, tmp_path):
    cfg = write(tmp_path, "run.yaml", "hosts: [localhost:1, 127.0.0.1:1]\nbind_to: none\ndry_run: true\njson: true\n")
    run = run_trainrun("--config", cfg, "true")
    assert run.rc == 0, run.stderr
    assert [r["host"] for r in json.loads(run.stdout)["ranks"]] == ["localhost", "127.0.0.1"]


def test_cli_overrides_config(run_trainrun, tmp_path):
    cfg = write(tmp_path, "run.yaml", "np: 3\nprefix: none\n")
    run = run_trainrun("-np", 1, "--prefix", "rank", "--config", cfg, sys.executable, "-c", "print('hi')")
    assert run.rc == 0, run.stderr
    assert run.stdout.splitlines() == ["[0]<stdout>:hi"]


@pytest.mark.parametrize("text, needles", [
    ("np: 2\nnum_procs: 3\n", ["unknown key 'num_procs'"]),
    ("np: abc\n", ["'np'", "abc"]),
    ("grace: soon\n", ["'grace'", "soon"]),
    ("np: 0\n", ["'np'"]),
    ("prefix: fancy\n", ["'prefix'", "fancy"]),
    ("np: [1, 2]\n", ["'np'"]),
    ("np: 2\nhosts: {a: 1}\n", ["'hosts'"]),
    ("np: [1, 2\nprefix: none\n", ["not valid YAML"]),
    ("- np\n- 2\n", ["mapping"]),
    ("np: 1\nx: {A: 1}\n", ["'x'"]),
    ("np: 1\nx: [[A=1]]\n", ["'x'"]),
])
def test_config_errors_name_the_file(run_trainrun, tmp_path, text, needles):
    cfg = write(tmp_path, "bad.yaml", text)
    assert_one_line_error(run_trainrun("--config", cfg, "true"), 2, str(cfg), *needles)


@pytest.mark.parametrize("file_key, file_value, cli", [
    ("hosts", "localhost:2", ["--hostfile", "HOSTFILE"]),
    ("hostfile", "HOSTFILE", ["-H", "localhost:2"]),
])
def test_cli_hosts_override_config_hosts(run_trainrun, tmp_path, file_key, file_value, cli):
    """-H and --hostfile are one setting: given on the command line, either replaces the file's."""
    hf = write(tmp_path, "hf", "localhost slots=2\n")
    cfg = write(tmp_path, "run.yaml", f"{file_key}: {file_value.replace('HOSTFILE', str(hf))}\n")
    run = run_trainrun("--config", cfg, *[a.replace("HOSTFILE", str(hf)) for a in cli], "--dry-run", "--json", "true")
    assert run.rc == 0, run.stderr
    assert len(json.loads(run.stdout)["ranks"]) == 2


def test_config_bad_yaml_names_the_line(run_trainrun, tmp_path):
    cfg = write(tmp_path, "bad.yaml", "np: 2\nprefix: none\nhosts: [a, b\n")
    err = assert_one_line_error(run_trainrun("--config", cfg, "true"), 2)
    assert f"{cfg}:" in err  # file:line


def test_config_missing_file(run_trainrun, tmp_path):
    assert_one_line_error(run_trainrun("--config", tmp_path / "nope.yaml", "-np", 1, "true"), 2, "nope.yaml")


# bad input: one line, exit code 2 (126/127 for the program), no traceback

BAD_USAGE = [
    (["--bogus", "-np", "1", "true"], ["--bogus"]),
    (["-np", "0", "true"], ["-np", "0"]),
    (["-np", "-1", "true"], ["-np", "-1"]),
    (["-np", "x", "true"], ["-np", "'x'"]),
    (["-np", "1.5", "true"], ["-np"]),
    (["-np"], ["-np"]),
    (["-np", "1"], ["COMMAND"]),
    (["true"], ["-np"]),
    (["-H", "host:", "true"], ["host:"]),
    (["-H", "host:x", "true"], ["host:x"]),
    (["-H", ":4", "true"], [":4"]),
    (["-H", "host:-1", "true"], ["host:-1"]),
    (["-H", "localhost:0", "true"], ["localhost:0"]),
    (["-H", "localhost:1,,127.0.0.1:1", "true"], ["empty"]),
    (["-H", "localhost:1,localhost:2", "true"], ["localhost", "twice"]),
    (["-H", "bad host:1", "true"], ["bad host"]),
    (["-H", "localhost:1", "--hostfile", "hf", "true"], ["-H", "--hostfile"]),
    (["--grace", "-1", "-np", "1", "true"], ["--grace"]),
    (["--bind-to", "socket", "-np", "1", "true"], ["--bind-to", "socket"]),
    (["-x", "1BAD=2", "-np", "1", "true"], ["1BAD"]),
    (["-x", "=2", "-np", "1", "true"], ["-x"]),
    (["-x", "TRAINRUN_TEST_SURELY_UNSET", "-np", "1", "true"], ["TRAINRUN_TEST_SURELY_UNSET", "not set"]),
    (["--gpus-per-proc", "0", "-np", "1", "true"], ["--gpus-per-proc"]),
    (["--network-interface", "eth0,", "-np", "1", "true"], ["--network-interface eth0,", "not a NIC name"]),
    (["--exclude", "h1:gpu0", "-np", "1", "true"], ["--exclude entry 'h1:gpu0'"]),
    (["--ranks", "x", "-np", "1", "true"], ["--ranks x", "'x' is not a rank"]),
]


@pytest.mark.parametrize("args, needles", BAD_USAGE, ids=[" ".join(a) for a, _ in BAD_USAGE])
def test_bad_usage(run_trainrun, args, needles):
    assert_one_line_error(run_trainrun(*args, env=base_env(TRAINRUN_TEST_SURELY_UNSET=None)), 2, *needles)


def test_np_more_than_slots(run_trainrun):
    err = assert_one_line_error(run_trainrun("-H", "localhost:2", "-np", 3, "true"), 2, "--oversubscribe")
    assert re.search(r"\b3\b", err) and re.search(r"\b2\b", err), f"both -np and the slot count must be named: {err}"


def test_oversubscribe_allows_more_ranks_than_slots(run_trainrun):
    run = run_trainrun("-H", "localhost:2", "-np", 3, "--oversubscribe", "--prefix", "none",
                       sys.executable, "-c", "import os; print(os.environ['RANK'], os.environ['LOCAL_WORLD_SIZE'])")
    assert run.rc == 0, run.stderr
    assert sorted(run.stdout.splitlines()) == ["0 3", "1 3", "2 3"]


@pytest.mark.parametrize("hosts", ["no-such-host.invalid:2", "localhost:1,no-such-host.invalid:1"])
def test_remote_host_is_a_clear_error(run_trainrun, hosts):
    """A host that is not this machine: a one-line error naming it (2 while remote hosts are unsupported;
    3, a HostError, once SSH is in and the host cannot be reached)."""
    run = run_trainrun("-H", hosts, sys.executable, "-c", "pass", timeout=30)
    assert run.rc in (2, 3), run.stderr
    assert_one_line_error(run, run.rc, "no-such-host.invalid")


# hostfiles

def test_hostfile_runs(run_trainrun, tmp_path):
    hf = write(tmp_path, "hosts", "# two local names\nlocalhost slots=2\n\n127.0.0.1:1   # trailing comment\n")
    run = run_trainrun("--hostfile", hf, "--prefix", "none", sys.executable, "-c",
                       "import os; print(os.environ['RANK'], os.environ['NODE_RANK'], os.environ['NNODES'])")
    assert run.rc == 0, run.stderr
    assert sorted(run.stdout.splitlines()) == ["0 0 2", "1 0 2", "2 1 2"]


def test_hostfile_missing(run_trainrun, tmp_path):
    assert_one_line_error(run_trainrun("--hostfile", tmp_path / "nope", "true"), 2, "--hostfile", "nope")


def test_hostfile_is_a_directory(run_trainrun, tmp_path):
    assert_one_line_error(run_trainrun("--hostfile", tmp_path, "true"), 2, str(tmp_path), "directory")


@pytest.mark.parametrize("text, lineno, quoted", [
    ("localhost slots=2\n\nbad line here\n", 3, "bad line here"),
    ("# c\nlocalhost slots=0\n", 2, "localhost slots=0"),
    ("localhost slots=two\n", 1, "localhost slots=two"),
    ("localhost:2 slots=2\n", 1, "localhost:2 slots=2"),
    ("localhost cores=2\n", 1, "localhost cores=2"),
    ("localhost\n127.0.0.1\nlocalhost:2\n", 3, "localhost"),
])
def test_hostfile_bad_line(run_trainrun, tmp_path, text, lineno, quoted):
    hf = write(tmp_path, "hosts", text)
    assert_one_line_error(run_trainrun("--hostfile", hf, "true"), 2, f"{hf}:{lineno}", f"'{quoted}")


def test_hostfile_empty(run_trainrun, tmp_path):
    hf = write(tmp_path, "hosts", "# nothing\n\n")
    assert_one_line_error(run_trainrun("--hostfile", hf, "true"), 2, str(hf))


# the program

def test_program_not_found_on_path(run_trainrun):
    assert_one_line_error(run_trainrun("-np", 1, "no-such-program-zz"), 127, "no-such-program-zz")


def test_py_program_missing(run_trainrun):
    assert_one_line_error(run_trainrun("-np", 1, "missing.py"), 127, "missing.py")


def test_program_path_missing(run_trainrun):
    assert_one_line_error(run_trainrun("-np", 1, "./missing-prog"), 127, "missing-prog")


def test_program_not_executable(run_trainrun, tmp_path):
    prog = write(tmp_path, "prog.sh", "#!/bin/sh\necho hi\n")
    os.chmod(prog, 0o644)
    assert_one_line_error(run_trainrun("-np", 1, "./prog.sh"), 126, "prog.sh")


def test_program_is_a_directory(run_trainrun, tmp_path):
    (tmp_path / "adir").mkdir()
    assert_one_line_error(run_trainrun("-np", 1, "./adir"), 126, "adir")


def test_executable_script_runs(run_trainrun, tmp_path):
    prog = write(tmp_path, "prog.sh", "#!/bin/sh\necho \"rank $RANK args $#\"\n")
    os.chmod(prog, 0o755)
    run = run_trainrun("-np", 1, "--prefix", "none", "./prog.sh", "a b", "c")
    assert run.rc == 0, run.stderr
    assert run.stdout == "rank 0 args 2\n"


def test_program_not_a_valid_executable(run_trainrun, tmp_path):
    """Found and executable, but the kernel cannot run it (ENOEXEC): 126, like a shell."""
    prog = tmp_path / "garbage"
    prog.write_bytes(b"\x00\x01\x02 not a program, no #! line")
    os.chmod(prog, 0o755)
    assert_one_line_error(run_trainrun("-np", 2, "./garbage"), 126, "garbage")


def test_program_with_missing_interpreter(run_trainrun, tmp_path):
    prog = write(tmp_path, "prog", "#!/nonexistent/interpreter\necho hi\n")
    os.chmod(prog, 0o755)
    run = run_trainrun("-np", 2, "./prog")
    assert_one_line_error(run, 126, "bad interpreter /nonexistent/interpreter")


def test_output_reader_gone_ends_the_job_like_sigpipe(tmp_path):
    """`trainrun ... | head -1`: when nobody reads our output any more the job ends (exit 141), no traceback."""
    import subprocess
    import sys

    code = "import itertools\nfor i in itertools.count(): print(i)"
    p = subprocess.Popen([sys.executable, "-m", "trainrun", "-np", "2", sys.executable, "-c", code],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    p.stdout.readline()
    p.stdout.close()
    assert p.wait(30) == 141
    err = p.stderr.read().decode()
    assert "interrupted by SIGPIPE" in err and "Traceback" not in err


# input that crashed or exhausted the launcher (issue 25): one line, exit 2, nothing planned

LABEL64 = "a" * 64


@pytest.mark.parametrize("args, needles", [
    (["-H", "a..b:2", "true"], ["-H entry 'a..b:2'", "not a valid host name"]),
    (["-H", f"{LABEL64}:2", "true"], [LABEL64, "at most 63"]),
    (["-H", "a..b:2", "--check"], ["a..b", "not a valid host name"]),
    (["-H", "good,x.-y:1", "--dry-run", "true"], ["'x.-y'", "starts or ends with '-'"]),
])
def test_bad_host_name_is_one_line(run_trainrun, args, needles):
    """Before: the resolver's idna codec raised a 55-line UnicodeError traceback, exit 1."""
    assert_one_line_error(run_trainrun(*args, "--ssh-timeout", 2, timeout=30), 2, *needles)


def test_bad_host_name_in_a_hostfile_names_file_and_line(run_trainrun, tmp_path):
    hf = write(tmp_path, "hosts", f"localhost slots=1\n{LABEL64}.example slots=2\n")
    assert_one_line_error(run_trainrun("--hostfile", hf, "--check"), 2, f"{hf}:2", "at most 63")


@pytest.mark.parametrize("args, needles", [
    (["-H", "h1:1000000000", "--dry-run", "true"], ["slots 1000000000", "65536"]),
    (["-np", "100000", "--oversubscribe", "--dry-run", "true"], ["-np 100000", "at most 65536"]),
])
def test_job_size_is_capped(run_trainrun, args, needles):
    """Before: planned eagerly and quadratically (-H h1:1000000000 grew ~100 MB every 5 s for ever)."""
    assert_one_line_error(run_trainrun(*args, timeout=30), 2, *needles)


def test_hostfile_with_a_byte_order_mark_runs(run_trainrun, tmp_path):
    hf = tmp_path / "hosts"
    hf.write_bytes(b"\xef\xbb\xbflocalhost slots=2\n")
    run = run_trainrun("--hostfile", hf, "--prefix", "none", sys.executable, "-c", "import os; print(os.environ['RANK'])")
    assert run.rc == 0, run.stderr
    assert sorted(run.stdout.split()) == ["0", "1"]


@pytest.mark.parametrize("export, needle", [("TRAINRUN_TEST_SURELY_UNSET", "not set"), ("1BAD=2", "not a variable name")])
def test_export_is_checked_before_any_host_is_reached(run_trainrun, export, needle):
    """Before: the hosts were reached first (here: a dns failure, exit 3) and -x was read only when planning."""
    run = run_trainrun("-H", "no-such-host.invalid:1", "-x", export, "true", env=base_env(TRAINRUN_TEST_SURELY_UNSET=None))
    assert_one_line_error(run, 2, f"-x {export.split('=')[0]}", needle)


@pytest.mark.parametrize("option, needle", [("--network-interface=eth0,,eth1", "not a NIC name"),
                                            ("--ranks=1-x", "not a rank"), ("--exclude=a@b", "--exclude entry")])
def test_option_strings_are_parsed_before_any_host_is_reached(run_trainrun, option, needle):
    """Parsed once where argv is read (config.parse_config): a bad value is exit 2 before the hosts are
    reached (here a DNS failure, exit 3), not found later by the layer that uses it."""
    assert_one_line_error(run_trainrun("-H", "no-such-host.invalid:1", option, "true"), 2, needle)


def test_config_file_strings_are_parsed_like_flags(run_trainrun, tmp_path):
    cfg = write(tmp_path, "run.yaml", "np: 1\nnetwork-interface: 'eth0,,eth1'\n")
    assert_one_line_error(run_trainrun("--config", cfg, "true"), 2, "--network-interface eth0,,eth1", "not a NIC name")
    cfg = write(tmp_path, "run.yaml", "hosts: [localhost:1, 'bad host']\n")
    assert_one_line_error(run_trainrun("--config", cfg, "true"), 2, "-H entry 'bad host'")


def test_sigint_stops_planning_when_started_with_sigint_ignored(tmp_path):
    """`trainrun ... &` in a script starts it with SIGINT ignored; Python keeps that, so before, SIGINT did
    nothing until the job's own handler was installed after planning. A FIFO as hostfile holds trainrun in
    the planning step (reading the hosts) for as long as the test likes."""
    import signal
    import time

    fifo = tmp_path / "hosts"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-m", "trainrun", "--hostfile", str(fifo), "true"], stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        time.sleep(1.5)  # started and blocked opening the FIFO (a SIGINT earlier than that is answered too)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail("SIGINT did not stop trainrun while it planned")
    assert rc == 130 and b"Traceback" not in proc.stderr.read()


def test_check_finds_a_missing_workdir_here(run_trainrun, tmp_path):
    """Before: --check passed and the launch then failed on every rank with 127."""
    run = run_trainrun("-np", 2, "--workdir", tmp_path / "gone", "--check")
    assert run.rc == 4, run.stdout + run.stderr
    assert f"problem: localhost: workdir: working directory {tmp_path / 'gone'} does not exist there" in run.stdout
