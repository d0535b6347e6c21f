"""The python tool's seccomp program, read instruction by instruction: a small classic-BPF interpreter runs
it over every system-call number of both machines it is built for, so each decision of the policy is
checked without a kernel; the hostile programs (test_hostile_programs.py) check the kernel agrees."""

from __future__ import annotations

import errno
import re
import struct
from pathlib import Path

import pytest

from trainer.envs import sandbox, seccomp
from trainer.envs.seccomp import RET_ALLOW, RET_KILL_PROCESS, errno_action

EPERM, ENOSYS = errno_action(errno.EPERM), errno_action(errno.ENOSYS)
X86_64, AARCH64, I386 = 0xC000003E, 0xC00000B7, 0x40000003
GLIBC_FORK_FLAGS = 0x01200011  # CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD
PTHREAD_FLAGS = 0x003D0F00  # CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | ...
HEADERS = {"x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")}


def run_filter(program: bytes, nr: int, arch: int, arg0: int = 0, arg1: int = 0) -> int:
    """What the kernel would return for (nr, arch, args[0], args[1]): only the opcodes the builder emits."""
    data = struct.pack("=IIQ6Q", nr, arch, 0, arg0, arg1, 0, 0, 0, 0)
    insns = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x25: acc > k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_every_number_gets_the_policys_answer(machine: str) -> None:
    program = seccomp.filter_program(machine)
    arch = X86_64 if machine == "x86_64" else AARCH64
    column = 0 if machine == "x86_64" else 1
    refused = seccomp.refused_numbers(machine)
    clone, clone3 = (numbers[column] for numbers in seccomp.CLONE.values())
    assert len(program) // 8 < 4096  # the kernel's limit on a filter's length
    for nr in range(0, 1100):
        answer = run_filter(program, nr, arch)
        if nr > seccomp.MAX_REVIEWED_NR or nr == clone3:
            assert answer == ENOSYS, nr
        elif nr in refused:
            assert answer == EPERM, (nr, refused[nr])
        else:
            assert answer == RET_ALLOW, nr
    # clone: the threads and forks glibc makes pass; any namespace flag is refused.
    assert run_filter(program, clone, arch, GLIBC_FORK_FLAGS) == RET_ALLOW
    assert run_filter(program, clone, arch, PTHREAD_FLAGS) == RET_ALLOW
    for bit in range(32):
        flag = 1 << bit
        expected = EPERM if flag & seccomp.CLONE_NEW_FLAGS else RET_ALLOW
        assert run_filter(program, clone, arch, flag | GLIBC_FORK_FLAGS) == expected, hex(flag)
    assert seccomp.CLONE_NEW_FLAGS == 0x7E020000
    # Another ABI's numbers mean other calls: the process is killed, whatever the number.
    for nr in (0, 41, 102, 359, 435):
        assert run_filter(program, nr, I386) == RET_KILL_PROCESS
    other = AARCH64 if machine == "x86_64" else X86_64
    assert run_filter(program, 41, other) == RET_KILL_PROCESS
    if machine == "x86_64":
        for nr in (0x40000000, 0x40000000 | 41, 0x40000000 | 39, 0xFFFFFFFF):
            assert run_filter(program, nr, arch) == RET_KILL_PROCESS, hex(nr)


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_fcntl_locks_leases_and_notifications_are_refused_and_the_rest_pass(machine: str) -> None:
    """N2: a lock on a read-only bound host file is seen by every other sandbox and the host. Every lock,
    lease and dnotify command of fcntl is refused; its other commands (descriptors, flags) pass."""
    program = seccomp.filter_program(machine)
    arch = X86_64 if machine == "x86_64" else AARCH64
    fcntl_nr = seccomp.number_of("fcntl", machine)
    assert fcntl_nr is not None
    refused = {5, 6, 7, 36, 37, 38, 1024, 1025, 1026}
    assert set(seccomp.FCNTL_REFUSED.values()) == refused
    for command in range(0, 1100):
        expected = EPERM if command in refused else RET_ALLOW
        assert run_filter(program, fcntl_nr, arch, 3, command) == expected, command
    # Only the low 32 bits are the command (the kernel reads an int): high bits do not slip a lock through.
    assert run_filter(program, fcntl_nr, arch, 3, (1 << 32) | 6) == EPERM
    for name in ("flock", "inotify_init1", "inotify_add_watch"):
        number = seccomp.number_of(name, machine)
        assert number is not None and run_filter(program, number, arch) == EPERM, name


def test_the_findings_calls_are_refused_by_name() -> None:
    """The issue's probes and the classes they stand for are in the table, under the calls' own names."""
    names = set(seccomp.REFUSED)
    findings = {"socket", "socketpair", "io_uring_setup", "io_uring_enter", "io_uring_register", "ptrace"}
    findings |= {"unshare", "setns", "mount", "umount2", "pivot_root", "bpf", "perf_event_open", "keyctl"}
    findings |= {"add_key", "request_key", "userfaultfd", "process_vm_readv", "process_vm_writev"}
    findings |= {"kexec_load", "kexec_file_load", "init_module", "finit_module", "personality"}
    findings |= {"shmget", "msgget", "semget", "mq_open", "memfd_create", "flock", "inotify_add_watch"}
    assert findings <= names, findings - names
    for common in ("read", "write", "openat", "mmap", "execve", "exit_group", "futex", "getrandom", "wait4"):
        assert common not in names


@pytest.mark.parametrize("machine", sorted(HEADERS))
def test_the_table_matches_the_kernel_headers(machine: str) -> None:
    header = HEADERS[machine]
    if not header.exists():
        pytest.skip(f"{header} is not installed (linux-libc-dev)")
    numbers = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR_(\w+) (\d+)", header.read_text())}
    for name, (x86_64, _) in {**seccomp.REFUSED, **seccomp.CLONE, **seccomp.FCNTL}.items():
        if x86_64 is not None and name in numbers:  # headers older than the kernel lack the newest calls
            assert numbers[name] == x86_64, name
    assert max(numbers.values()) <= seccomp.MAX_REVIEWED_NR


def test_a_machine_without_a_table_never_runs_unfiltered(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="no system-call table for riscv64"):
        seccomp.filter_program("riscv64")

    class Uname:
        machine = "riscv64"

    monkeypatch.setattr(seccomp.os, "uname", lambda: Uname())
    problem = sandbox.available()
    assert problem is not None and "riscv64" in problem
