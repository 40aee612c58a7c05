"""remote_command: the one remote shell string; and the pure parts of ssh.py (resolve, classify)."""
import errno
import json
import os
import shutil
import socket
import subprocess
import sys

import paramiko
import pytest

from trainrun.errors import UsageError
from trainrun.fanout.ssh import SSHOptions, SSHTarget, UnknownHostKey, classify, known_hosts_lines, remote_command, resolve

NASTY = ["a b", "it's", 'say "hi"', "x; rm -rf /", "$(touch /tmp/pwned)", "`id`", "a\nb", "tab\there",
         "ünïcødé ✓", "*", "~", "$HOME", "back\\slash", "--flag", "", "!event", "a'\"'b", "#comment"]

ECHO = ("import json, os, sys; print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd(), "
        "'env': {k: v for k, v in os.environ.items() if k.startswith('T_')}}))")


@pytest.mark.parametrize("argv, env, cwd, expected", [
    (["python", "train.py"], {}, None, "exec python train.py"),
    (["python", "train.py"], {"RANK": "0", "X": "a b"}, "/w", "cd /w && exec env RANK=0 'X=a b' python train.py"),
    (["echo", "a;b"], None, "/my dir", "cd '/my dir' && exec echo 'a;b'"),
    (["echo", "$(id)"], {"V": "'"}, None, "exec env 'V='\"'\"'' echo '$(id)'"),
])
def test_literal_command_lines(argv, env, cwd, expected):
    assert remote_command(argv, env, cwd) == expected


@pytest.mark.parametrize("shell", ["sh", "bash", "dash"])
def test_round_trip_through_a_posix_shell(shell, tmp_path):
    """Whatever the strings hold, the shell runs exactly this argv with exactly this env in exactly this cwd."""
    if not shutil.which(shell):
        pytest.skip(f"no {shell}")
    cwd = tmp_path / "dir with 'quotes' $(x) ; and\nnewline ü"
    cwd.mkdir()
    env = {f"T_{i}": value for i, value in enumerate(NASTY)}
    line = remote_command([sys.executable, "-c", ECHO, *NASTY], env, str(cwd))
    out = subprocess.run([shell, "-c", line], capture_output=True, text=True, check=True, cwd="/",
                         env={"PATH": os.environ["PATH"], "HOME": "/nonexistent"})
    assert json.loads(out.stdout) == {"argv": NASTY, "cwd": str(cwd), "env": env}
    assert not os.path.exists("/tmp/pwned")


@pytest.mark.parametrize("argv, env, cwd", [
    ([], {}, None),
    (["-x"], {}, None),
    (["A=1"], {}, None),
    (["ls"], {"BAD NAME": "1"}, None),
    (["ls"], {"1X": "1"}, None),
    (["ls"], {"A=B": "1"}, None),
    (["ls"], {}, ""),
    (["ls"], {}, "-P"),
    (["ls", "a\0b"], {}, None),
    (["ls"], {"A": "\0"}, None),
])
def test_rejects_what_cannot_be_passed_safely(argv, env, cwd):
    with pytest.raises(ValueError):
        remote_command(argv, env, cwd)


def test_resolve_applies_config_then_explicit_options(tmp_path):
    key = tmp_path / "key"
    key.write_text("x")
    config = tmp_path / "config"
    config.write_text(f"Host n1\n  HostName 10.0.0.5\n  Port 2200\n  User alice\n  IdentityFile {key}\n"
                      f"  IdentityFile {tmp_path}/missing\n  IdentitiesOnly yes\n"
                      f"  UserKnownHostsFile {tmp_path}/kh /other/kh\n")
    t = resolve("n1", SSHOptions(ssh_config=str(config)))
    assert t == SSHTarget("n1", "10.0.0.5", 2200, "alice", (str(key),), True, f"{tmp_path}/kh")
    t = resolve("n1", SSHOptions(ssh_config=str(config), port=22, user="bob", identity_file="~/k",
                                 known_hosts="/kh"))
    assert (t.port, t.user, t.identity_files, t.known_hosts) == (22, "bob", (os.path.expanduser("~/k"),), "/kh")
    t = resolve("carol@n1", SSHOptions(ssh_config=str(config), user="bob"))
    assert (t.host, t.hostname, t.port, t.user) == ("carol@n1", "10.0.0.5", 2200, "carol")  # user@host wins
    t = resolve("other", SSHOptions(ssh_config=None))
    assert (t.hostname, t.port, t.identity_files, t.identities_only) == ("other", 22, (), False)
    assert t.known_hosts == os.path.expanduser("~/.ssh/known_hosts")


@pytest.mark.parametrize("kwargs", [dict(port=0), dict(port=70000), dict(connect_timeout=0),
                                    dict(ssh_config="/nonexistent/config")])
def test_options_validate(kwargs):
    with pytest.raises(UsageError):
        SSHOptions(**kwargs)



class _Key:
    """Stands in for a paramiko key in BadHostKeyException."""
    def __init__(self, fp):
        self.fingerprint = fp

    def get_name(self):
        return "ssh-ed25519"

    def get_base64(self):
        return "AAAA"


def _refused():
    return paramiko.ssh_exception.NoValidConnectionsError({("10.0.0.5", 22): ConnectionRefusedError(
        errno.ECONNREFUSED, "Connection refused")})


@pytest.mark.parametrize("exc, authenticating, stage, in_hint", [
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), False, "dns", "HostName"),
    (_refused(), False, "tcp", "-p/--ssh-port"),
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), False, "tcp", "-p/--ssh-port"),
    (TimeoutError("timed out"), False, "tcp", "-p/--ssh-port"),
    (OSError(errno.ENETUNREACH, "Network is unreachable"), False, "tcp", "network"),
    (paramiko.SSHException("Error reading SSH protocol banner"), False, "ssh", "-p/--ssh-port"),
    (EOFError(), False, "ssh", "-p/--ssh-port"),
    (UnknownHostKey("10.0.0.5"), False, "hostkey", "ssh-keyscan"),
    (paramiko.AuthenticationException("Authentication failed."), True, "auth", "-i/--ssh-identity-file"),
    (paramiko.PasswordRequiredException("encrypted"), True, "auth", "-i/--ssh-identity-file"),
    (paramiko.SSHException("not a valid OPENSSH private key file"), True, "auth", "-i/--ssh-identity-file"),
])
def test_classify_stages(exc, authenticating, stage, in_hint):
    t = SSHTarget("n1", "10.0.0.5", 22, "root", ("/k",), True, "/kh")
    err = classify(t, exc, authenticating)
    assert (err.host, err.stage) == ("n1", stage)
    assert in_hint in err.hint
    assert str(err).startswith(f"n1: {stage}: ") and "\n" not in str(err)


def test_changed_host_key_names_file_and_line(tmp_path):
    kh = tmp_path / "known_hosts"
    hashed = paramiko.HostKeys.hash_host("10.0.0.5")
    kh.write_text(f"# comment\nother ssh-ed25519 AAAA\n{hashed} ssh-ed25519 AAAA\n[10.0.0.5]:2200 ssh-ed25519 A\n")
    assert known_hosts_lines(str(kh), "10.0.0.5") == [3]
    assert known_hosts_lines(str(kh), "[10.0.0.5]:2200") == [4]
    t = SSHTarget("n1", "10.0.0.5", 22, "root", (), False, str(kh))
    err = classify(t, paramiko.BadHostKeyException("10.0.0.5", _Key("SHA256:new"), _Key("SHA256:old")))
    assert err.stage == "hostkey"
    assert f"line 3 of {kh}" in str(err) and "SHA256:new" in str(err)


def test_match_exec_still_works_with_lazy_invoke(tmp_path):
    """ssh.py keeps paramiko from importing `invoke` up front; `Match exec` must still run it (in a
    subprocess: invoke reads stdin, which pytest's capture forbids)."""
    import subprocess
    import sys

    config = tmp_path / "config"
    config.write_text('Match exec "true"\n  Port 2201\nMatch exec "false"\n  User nobody\n')
    code = ("import sys; from trainrun.fanout.ssh import resolve, SSHOptions; assert 'invoke' not in sys.modules; "
            f"t = resolve('n1', SSHOptions(ssh_config={str(config)!r})); print(t.port, t.user)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    port, user = out.stdout.split()
    assert port == "2201" and user != "nobody", out.stderr


def test_bad_hostname_from_the_ssh_config_is_a_dns_failure(tmp_path):
    """The alias the user typed is a valid name (checked at parse time), but the ssh config maps it to one that
    is not: before, the resolver's idna codec raised UnicodeError out of connect (a traceback, exit 1)."""
    from trainrun.errors import HostError
    from trainrun.fanout.ssh import connect

    config = tmp_path / "ssh_config"
    config.write_text("Host box\n  HostName a..b\n")
    with pytest.raises(HostError) as err:
        connect("box", SSHOptions(ssh_config=str(config), known_hosts=str(tmp_path / "kh"), connect_timeout=2))
    assert str(err.value) == "box: dns: HostName 'a..b' is not a valid host name (fix the HostName in the ssh config)"


@pytest.mark.parametrize("python, strict, code, said", [
    (sys.executable, True, 0, None),
    (os.path.basename(sys.executable), True, 0, None),   # a bare name (--python python3) is looked up on PATH
    ("/no/such/python", False, 0, None),                 # not given with --python: python3 takes its place
    ("/no/such/python", True, 127, "h2: python: --python /no/such/python: no such interpreter there (check the path given to --python)"),
    ("/", True, 127, "h2: python: --python /: no such interpreter there (check the path given to --python)"),
])
def test_the_remote_interpreter_pick(python, strict, code, said):
    """The shell line that starts `python -m MODULE` on a host, run here by sh as sshd would run it."""
    from trainrun.fanout.python_pick import no_python_error
    from trainrun.fanout.ssh_engine import python_module_command

    env = dict(os.environ, PATH=f"{os.path.dirname(sys.executable)}:/usr/bin:/bin")
    r = subprocess.run(["sh", "-c", python_module_command(python, "platform", strict=strict)], capture_output=True, text=True, env=env)
    assert r.returncode == code, r.stderr
    err = no_python_error("h2", r.stderr)
    assert (str(err) if err else None) == said


def test_no_python3_at_all_is_named(tmp_path):
    """A PATH with sh and no python3. Before: `sh: 1: exec: python3: not found` from the shell."""
    from trainrun.fanout.python_pick import no_python_error
    from trainrun.fanout.ssh_engine import python_module_command

    (tmp_path / "sh").symlink_to("/bin/sh")
    r = subprocess.run(["/bin/sh", "-c", python_module_command("/no/such/python", "platform")], capture_output=True, text=True,
                       env={"PATH": str(tmp_path)})
    assert r.returncode == 127 and str(no_python_error("h2", r.stderr)) == "h2: python: python3 not found (pass --python)"
