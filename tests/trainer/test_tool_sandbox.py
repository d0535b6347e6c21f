"""The built-in tools: the calculator's allow-list, and the Python tool's sandbox (bubblewrap). Each hostile
program (an endless loop, unbounded allocation, a fork bomb, a socket, reads and writes outside its
directory) is stopped and comes back as a tool error from the environment, whose episode goes on; a
megabyte of output is cut at the limit; a malformed call is a tool error, not an exception."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path

import pytest

from contract.spec import EnvironmentSpec, ToolLimitsSpec
from tests.conftest import requires_binary
from trainer.envs import sandbox
from trainer.envs.tool_use import ToolUseEnv, parse_call
from trainer.envs.tools import CalculatorError, calculate, calculator_tool
from trainer.tasks.sources import Example

LIMITS = ToolLimitsSpec(cpu_seconds=1, wall_seconds=1.5, memory_mb=128, processes=4, output_bytes=2048)


def _env(tools: list[str], limits: ToolLimitsSpec = LIMITS) -> ToolUseEnv:
    env = ToolUseEnv(EnvironmentSpec(tools=tools, max_turns=3, limits=limits))  # type: ignore[arg-type]
    env.reset(Example(prompt="47*86=", answer="4042"))
    return env


def test_calculator_evaluates_arithmetic_and_refuses_everything_else() -> None:
    assert calculate("347*68") == 23596
    assert calculate("(3+4)*-5") == -35
    assert calculate("2**10 // 3 % 7") == 341 % 7
    assert calculate(" 7/2 ") == 3.5
    refused = [
        "__import__('os').system('true')",
        "open('/etc/passwd')",
        "x",
        "(1).__class__",
        "[1, 2]",
        "1 if 1 else 2",
        "2**100000",  # exponent bound
        "9**9**9",
        "10**999*10**999*10",  # size bound
        "1/0",
        "2.0**5000",  # float overflow
        "(" * 300 + "1" + ")" * 300,
        "",
        "1 +",
    ]
    for expression in refused:
        with pytest.raises(CalculatorError):
            calculate(expression)
    result = calculator_tool("1/0", LIMITS)
    assert result.error and result.text == "error: division by zero"
    assert calculator_tool("6*7", LIMITS).text == "42"


def test_calls_are_parsed_by_name_or_position_and_malformed_ones_are_tool_errors() -> None:
    tools = ["calculator", "python"]
    call = parse_call("(1)47*86", tools)
    assert call is not None and (call.tool, call.argument) == ("calculator", "47*86")
    call = parse_call("(python)print(1)", tools)
    assert call is not None and (call.tool, call.argument) == ("python", "print(1)")
    assert parse_call("4042", tools) is None  # an answer
    env = _env(["calculator"])
    for text in ("(7)1+1", "(shell)ls", "(1)", "(1)1+", "(calculator)import os"):
        env = _env(["calculator"])
        outcome = env.step(text)
        assert not outcome.done and outcome.result is not None and outcome.result.error, text
        assert outcome.observation is not None and outcome.observation.startswith("error: ")
        assert env.errors == 1 and env.calls == 1
        final = env.step("4042")  # the episode goes on to its answer
        assert final.done and env.answer == "4042"


HOSTILE = {
    # name: (program, what the error says, stopped by the time limit)
    "endless-loop": ("while True: pass", "time limit", True),
    "sleeps-forever": ("import time\ntime.sleep(60)", "time limit", True),
    "allocates-without-bound": ("x = []\nwhile True: x.append(bytearray(10**7))", "MemoryError", False),
    "fork-bomb": ("import os\nwhile True: os.fork()", "Resource temporarily unavailable", False),
    "opens-a-socket": (
        "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))",
        "Operation not permitted",
        False,
    ),
    "reads-the-jobs-files": ("print(open({secret!r}).read())", "No such file", False),
    "reads-etc": ("print(open('/etc/passwd').read())", "No such file", False),
    "writes-outside": ("open({outside!r}, 'w').write('x')", "No such file", False),
    "writes-usr": ("open('/usr/evil', 'w').write('x')", "Read-only file system", False),
}


@requires_binary("bwrap")
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_programs_are_stopped_and_reported_as_tool_errors(case: str, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("the job's files")
    outside = tmp_path / "written-from-the-sandbox"
    server = socket.create_server(("127.0.0.1", 0))  # a real listener on the host's loopback
    template, expected, timeout = HOSTILE[case]
    code = template.format(port=server.getsockname()[1], secret=str(secret), outside=str(outside))
    sandbox.python_runtime()  # found once per process (ldd over the standard library), not per call
    env = _env(["python"])
    started = time.monotonic()
    outcome = env.step(f"(python){code}")
    elapsed = time.monotonic() - started
    assert outcome.result is not None and not outcome.done
    assert outcome.result.error, outcome.result
    assert outcome.result.timeout is timeout, outcome.result
    assert expected in outcome.result.text, outcome.result.text
    assert elapsed < LIMITS.wall_seconds + 2.0, elapsed
    assert (env.calls, env.errors, env.timeouts) == (1, 1, int(timeout))
    assert env.step("4042").done and env.answer == "4042"  # the episode (and training) goes on
    assert not outside.exists()
    server.setblocking(False)
    with pytest.raises(BlockingIOError):  # nothing reached the host's socket (the call has returned)
        server.accept()
    server.close()


@requires_binary("bwrap")
def test_the_scratch_directory_is_writable_and_fresh_for_every_call() -> None:
    wrote = _env(["python"]).step(
        "(python)open('notes.txt', 'w').write('kept')\nprint(open('notes.txt').read())"
    )
    assert wrote.result is not None and not wrote.result.error and wrote.result.text == "kept"
    again = _env(["python"]).step("(python)import os\nprint(os.listdir('.'), os.getcwd())")
    assert again.result is not None and again.result.text == "[] /work"


@requires_binary("bwrap")
def test_a_megabyte_of_output_is_cut_at_the_limit() -> None:
    result = sandbox.run_python("print('x' * 2**20)", LIMITS)
    assert result.truncated and result.exit_code == 0
    assert result.output == "x" * LIMITS.output_bytes + sandbox.TRUNCATED_MARK
    outcome = _env(["python"]).step("(python)print('y' * 2**20)")
    assert outcome.result is not None and not outcome.result.error
    assert outcome.result.text.startswith("y" * LIMITS.output_bytes) and outcome.result.text.endswith(
        "truncated]"
    )
    ok = sandbox.run_python("print(6 * 7)", LIMITS)
    assert (ok.output, ok.exit_code, ok.timed_out, ok.truncated) == ("42\n", 0, False, False)


def test_a_python_tool_job_without_the_sandbox_stops_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contract.spec import load_spec
    from trainer.engine import Engine

    spec = load_spec(Path(__file__).resolve().parents[2] / "trainer" / "specs" / "tool_use_tiny.yaml")
    spec = spec.model_copy(update={"environment": EnvironmentSpec(tools=["calculator", "python"])})
    monkeypatch.setenv(sandbox.BWRAP_ENV, str(tmp_path / "no-bwrap-here"))
    with pytest.raises(ValueError, match=r"environment\.tools: the python tool cannot run .*bwrap"):
        Engine(spec, tmp_path / "out", progress=False).setup()
    outcome = _env(["python"]).step("(python)print(1)")  # a call there would be a tool error, not a crash
    assert (
        outcome.result is not None and outcome.result.error and "sandbox unavailable" in outcome.result.text
    )


# Issue 21's findings, probed as an attacker would: each failed on the sandbox before the fix.


@requires_binary("bwrap")
def test_the_parents_secrets_are_nowhere_in_the_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    """/proc/1/environ was bwrap's, which had inherited the trainer's (the worker's) whole environment."""
    canary = f"CANARY{time.monotonic_ns()}"
    monkeypatch.setenv("STARE_DATABASE_URL", f"postgresql://u:{canary}@h/db")
    program = (
        "import os\n"
        "for pid in sorted(p for p in os.listdir('/proc') if p.isdigit()):\n"
        "    print(pid, open(f'/proc/{pid}/environ', 'rb').read(), open(f'/proc/{pid}/cmdline', 'rb').read())\n"
        "print(sorted(os.environ))"
    )
    result = sandbox.run_python(program, LIMITS)
    assert result.exit_code == 0, result.output
    assert canary not in result.output and "STARE_" not in result.output, result.output
    first, names = result.output.strip().splitlines()
    assert first.startswith("1 b'HOME=/work\\x00TMPDIR=/work\\x00LD_LIBRARY_PATH="), first  # pid 1: itself
    assert names == "['HOME', 'LD_LIBRARY_PATH', 'PWD', 'TMPDIR']"


@requires_binary("bwrap")
def test_shared_memory_is_gone_and_the_scratch_size_is_the_whole_write_budget() -> None:
    """With memory_mb=256, a call wrote 1.6 GB into /dev/shm: RLIMIT_FSIZE bounds one file, not the total."""
    limits = ToolLimitsSpec(cpu_seconds=3, wall_seconds=6, memory_mb=256, processes=4, output_bytes=4096)
    program = (
        "import os\n"
        "for path in ('/dev/shm/fill', '/tmp/fill', '/dev/mqueue/fill', '/fill'):\n"
        "    try:\n"
        "        open(path, 'wb').write(b'x' * 2**20)\n"
        "        print(path, 'written')\n"
        "    except OSError as err:\n"
        "        print(path, type(err).__name__)\n"
        "total = 0\n"
        "try:\n"
        "    for i in range(200):\n"
        "        with open(f'part-{i}', 'wb') as f:\n"
        "            for _ in range(8):\n"
        "                f.write(b'x' * 2**20)\n"
        "                f.flush()\n"
        "                total += 1\n"
        "except OSError as err:\n"
        "    print('total', total, err.strerror)\n"
    )
    stats = os.statvfs("/dev/shm")
    before = (stats.f_blocks - stats.f_bfree) * stats.f_frsize
    result = sandbox.run_python(program, limits)
    stats = os.statvfs("/dev/shm")
    grown = (stats.f_blocks - stats.f_bfree) * stats.f_frsize - before
    lines = result.output.strip().splitlines()
    assert lines[:4] == [
        "/dev/shm/fill FileNotFoundError",
        "/tmp/fill FileNotFoundError",
        "/dev/mqueue/fill FileNotFoundError",
        "/fill OSError",  # EROFS: the root is read-only
    ], result.output
    words = lines[4].split(maxsplit=2)
    assert words[0] == "total" and int(words[1]) <= limits.memory_mb, result.output
    assert words[2] == "No space left on device", result.output
    assert grown < limits.memory_mb * 2**20, grown


@requires_binary("bwrap")
def test_the_system_calls_of_the_findings_are_refused() -> None:
    """socket() was the one refused call: socketpair, io_uring_setup, ptrace of pid 1 and a nested unshare
    went through. Raw calls via ctypes, so the interpreter cannot be what refuses them."""
    if os.uname().machine != "x86_64":
        pytest.skip("x86_64 system-call numbers")
    program = (
        "import ctypes, socket\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def raw(nr, *args):\n"
        "    ctypes.set_errno(0)\n"
        "    return libc.syscall(nr, *args), ctypes.get_errno()\n"
        "try:\n"
        "    socket.socketpair()\n"
        "except OSError as err:\n"
        "    print('socketpair', err.errno)\n"
        "print('io_uring_setup', raw(425, 8, 0))\n"
        "print('ptrace', raw(101, 16, 1, 0, 0))\n"  # PTRACE_ATTACH to pid 1
        "print('unshare', raw(272, 0x10000000))\n"  # CLONE_NEWUSER
    )
    result = sandbox.run_python(program, LIMITS)
    assert result.output.strip().splitlines() == [
        "socketpair 1",
        "io_uring_setup (-1, 1)",
        "ptrace (-1, 1)",
        "unshare (-1, 1)",
    ], result.output


def test_a_bubblewrap_without_the_needed_options_makes_the_tool_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bwrap before 0.8 lacks --disable-userns and --as-pid-1: refused up front, never run with less."""
    old = tmp_path / "bwrap"
    old.write_text("#!/bin/sh\necho 'bubblewrap 0.6.1'\n")
    old.chmod(0o755)
    monkeypatch.setenv(sandbox.BWRAP_ENV, str(old))
    problem = sandbox.available()
    assert problem is not None and "bubblewrap 0.6.1 is older than 0.8" in problem
    with pytest.raises(sandbox.SandboxUnavailable, match=r"older than 0\.8"):
        sandbox.run_python("print(1)", LIMITS)


def test_a_sandbox_that_cannot_start_here_is_found_before_the_job_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Installed but refused its namespaces (a container without user namespaces): available() starts one
    real sandbox and reports bwrap's own words, so the job stops at setup instead of failing every call."""
    with tempfile.TemporaryDirectory() as folder:  # not pytest's tmp_path: the sandbox's user must run it
        os.chmod(folder, 0o755)
        refused = Path(folder) / "bwrap"
        refused.write_text(
            "#!/bin/sh\n"
            "if [ \"$1\" = --version ]; then echo 'bubblewrap 0.8.0'; exit 0; fi\n"
            "echo 'bwrap: No permissions to create new namespace' >&2; exit 1\n"
        )
        refused.chmod(0o755)
        monkeypatch.setenv(sandbox.BWRAP_ENV, str(refused))
        problem = sandbox.available()
    assert (
        problem
        == f"the sandbox does not start here ({refused}): bwrap: No permissions to create new namespace"
    )
