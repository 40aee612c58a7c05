"""The troubleshooting page is keyed by the one-line messages trainrun prints: every message in a heading's
backticks must still be in the code (launcher/trainrun/), `...` standing for the parts that vary."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "troubleshooting.md"
# printed by cli/command.py and horovodrun/__init__.py; "trainrun: " by the output sink before a launcher line
PREFIXES = ("trainrun: error: ", "horovodrun: error: ", "trainrun: ")
# HostError(host, stage, message) prints "host: stage: message" (errors.py): a line "...: STAGE: message" is the
# stage's literal and the message
STAGES = ("dns", "tcp", "ssh", "hostkey", "auth", "python", "agent", "srun", "probe")
NOT_MESSAGES = {"StallError", "TensorMismatchError"}       # class names: checked as names below


def source_text() -> str:
    """Every module of the package as one text, with implicit string concatenation joined ("a " "b" -> "a b")
    and f-string fields made into `...`, so a message split over source lines or with a value in it matches."""
    text = "\n".join(p.read_text() for p in sorted((REPO / "launcher" / "trainrun").rglob("*.py")))
    text = re.sub(r"([\"'])\s*\n\s*f?([\"'])", "", text)          # "...through "\n   "mpirun, ..."
    return re.sub(r"\{[^{}\n]*\}", "...", text)                     # {host} -> ...


def messages() -> list[str]:
    return [m for line in PAGE.read_text().splitlines() if line.startswith("### ")
            for m in re.findall(r"`([^`]+)`", line)]


def fragments(message: str) -> list[str]:
    """The literal parts of `message` that the code must contain: the printed prefix off, `...` the gaps; a
    HostError's stage becomes its literal ('"dns"')."""
    for prefix in PREFIXES:
        if message.startswith(prefix):
            message = message[len(prefix):]
            break
    out = []
    for part in (p.strip(" :()%") for p in message.split("...")):
        stage = re.match(rf"^({'|'.join(STAGES)})(?:$|: (.*)$)", part)
        if stage:
            out += [f'"{stage.group(1)}"', stage.group(2) or ""]
        else:
            out.append(part)
    return [f for f in out if len(f) >= 4]


def test_every_message_on_the_page_is_in_the_code():
    src = source_text()
    found = messages()
    assert len(found) >= 30, found
    missing = []
    for message in found:
        if message in NOT_MESSAGES:
            assert f"class {message}(" in src, message
            continue
        missing += [(message, f) for f in fragments(message) if f not in src]
    assert not missing, "troubleshooting lines no longer in launcher/trainrun (reword the page):\n" + \
        "\n".join(f"  {m!r}: {f!r}" for m, f in missing)


def test_the_check_catches_a_made_up_message():
    assert fragments("trainrun: error: ...: frobnicated the host ... twice") == ["frobnicated the host", "twice"]
    assert fragments("...: dns: cannot resolve ...") == ['"dns"', "cannot resolve"]
    assert "frobnicated the host" not in source_text()
