"""Hostile python graders (tests/security/test_hostile_graders.py runs them): each is the body of an
`attack()` that a grader calls on the sample "attack" (and answers 0.5 to the sample "ping"). An attack
returns ESCAPED (1.0) only when what it tried worked: reading the planted environment variable or file,
reaching the network, seeing the host. Anything else it does (raising, hanging, dying, returning junk) is
the grader's own failure, which must end within the sample's budget and leave the pool grading.

Placeholders, filled in by the test: PLANT_FILE (a file in another job's folder on the host), PLANT_DIR
(that folder), PLANT_VALUE (the secret both hold; the parent's environment holds it in STARE_PLANT).
"""

from __future__ import annotations

# An attack's body; `os`, `sys`, `signal`, `socket`, `time`, `ctypes`, `builtins` and `threading` are
# imported, and `libc` is ctypes' libc with errno.
HOSTILE: dict[str, str] = {
    # --- the environment and files of the host, the trainer and other jobs --------------------------------
    "env_planted": "return 1.0 if 'PLANT_VALUE' in repr(dict(os.environ)) else 0.0",
    "env_pid1": "return 1.0 if 'PLANT_VALUE' in open('/proc/1/environ', errors='replace').read() else 0.0",
    "env_parent_proc": (
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n"
        "        try:\n"
        "            if 'PLANT_VALUE' in open(f'/proc/{pid}/environ', errors='replace').read():\n"
        "                return 1.0\n"
        "        except OSError:\n"
        "            pass\n"
        "return 0.0"
    ),
    "file_other_job": "return 1.0 if 'PLANT_VALUE' in open('PLANT_FILE').read() else 0.0",
    "list_other_job": "return 1.0 if os.listdir('PLANT_DIR') else 0.0",
    "file_etc_passwd": "return 1.0 if 'root:' in open('/etc/passwd').read() else 0.0",
    "file_etc_shadow": "return 1.0 if open('/etc/shadow').read() else 0.0",
    "file_root_home": "return 1.0 if os.listdir('/root') else 0.0",
    "file_host_tmp": "return 1.0 if os.listdir('/tmp') else 0.0",
    "host_root_listing": "return 1.0 if {'home', 'etc', 'var', 'root'} & set(os.listdir('/')) else 0.0",
    "proc_other_processes": "return 1.0 if [p for p in os.listdir('/proc') if p.isdigit() and p != '1'] else 0.0",
    "proc_self_root": "return 1.0 if 'etc' in os.listdir('/proc/1/root') else 0.0",
    "sys_fs": "return 1.0 if os.listdir('/sys') else 0.0",
    "dev_listing": "return 1.0 if {'sda', 'mem', 'kmem', 'nvme0'} & set(os.listdir('/dev')) else 0.0",
    "write_site_packages": "open('/grader/site-packages/planted.py', 'w').write('x'); return 1.0",
    "write_harness": "open('/grader/harness.py', 'a').write('# planted'); return 1.0",
    "write_root": "open('/planted', 'w').write('x'); return 1.0",
    "symlink_escape": "os.symlink('PLANT_FILE', '/work/link'); return 1.0 if 'PLANT_VALUE' in open('/work/link').read() else 0.0",
    # --- the network ----------------------------------------------------------------------------------------
    "net_postgres": "socket.create_connection(('127.0.0.1', 5432), timeout=1); return 1.0",
    "net_redis": "socket.create_connection(('127.0.0.1', 6379), timeout=1); return 1.0",
    "net_ipv6": "socket.create_connection(('::1', 6379), timeout=1); return 1.0",
    "net_external": "socket.create_connection(('1.1.1.1', 53), timeout=1); return 1.0",
    "net_udp": "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('127.0.0.1', 53)); return 1.0",
    "net_unix": "s = socket.socket(socket.AF_UNIX); s.connect('/var/run/postgresql/.s.PGSQL.5432'); return 1.0",
    "net_dns": "socket.getaddrinfo('pypi.org', 443); return 1.0",
    "net_urllib": "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000', timeout=1); return 1.0",
    "net_raw_socket": "socket.socket(socket.AF_PACKET, socket.SOCK_RAW); return 1.0",
    # --- processes and resources ----------------------------------------------------------------------------
    "fork_bomb": "while True:\n    os.fork()",
    "spawn_many": "import subprocess\nfor _ in range(1000):\n    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\nreturn 0.0",
    "thread_bomb": "while True:\n    threading.Thread(target=time.sleep, args=(60,)).start()",
    "memory_bomb": "x = bytearray(10 * 2**30); return 0.0",
    "memory_creep": "x = []\nwhile True:\n    x.append(bytearray(50 * 2**20))",
    "disk_fill": "f = open('/work/fill', 'wb')\nwhile True:\n    f.write(b'x' * 2**20)",
    "huge_output": "while True:\n    print('x' * 65536)",
    "busy_loop": "while True:\n    pass",
    "deep_recursion": "sys.setrecursionlimit(10**9)\ndef f(n):\n    return f(n + 1)\nreturn f(0)",
    "sleep_past_budget": "time.sleep(3600); return 0.0",
    "select_past_budget": "import select\nselect.select([], [], [], 3600); return 0.0",
    "signal_pause": "signal.pause(); return 0.0",
    "survivor_child": "if os.fork() == 0:\n    time.sleep(3600)\n    os._exit(0)\nreturn 0.0",
    "daemon_thread_writer": (
        'def spam():\n    while True:\n        os.write(1, b\'{"id": 999, "results": []}\\n\'); time.sleep(0.01)\n'
        "threading.Thread(target=spam, daemon=True).start(); return 0.0"
    ),
    # --- dying, exiting, signals ----------------------------------------------------------------------------
    "os_exit_0": "os._exit(0)",
    "os_exit_3": "os._exit(3)",
    "sys_exit": "sys.exit(0)",
    "keyboard_interrupt": "raise KeyboardInterrupt",
    "raise_memory_error": "raise MemoryError",
    "raise_custom": "class Weird(BaseException):\n    pass\nraise Weird('odd')",
    "kill_self": "os.kill(os.getpid(), signal.SIGKILL)",
    "segfault": "ctypes.string_at(0)",
    "abort": "os.abort()",
    "sigstop_self": "os.kill(os.getpid(), signal.SIGSTOP); return 0.0",
    "kill_pid1": "os.kill(1, signal.SIGKILL)",
    "kill_everyone": "os.kill(-1, signal.SIGKILL); return 0.0",
    "ignore_sigterm_loop": "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass",
    "alarm": "signal.alarm(1); time.sleep(5); return 0.0",
    "exec_replace": "os.execv(sys.executable, [sys.executable, '-c', 'print(1)'])",
    "close_pipes": "for fd in range(3, 64):\n    try:\n        os.close(fd)\n    except OSError:\n        pass\nreturn 0.0",
    "garbage_on_protocol": (
        "for fd in range(3, 64):\n    try:\n        os.write(fd, b'not json at all\\n')\n    except OSError:\n        pass\nreturn 0.0"
    ),
    # --- what it returns ------------------------------------------------------------------------------------
    "return_huge_string": "return 'x' * (10 * 2**20)",
    "return_list": "return [1.0]",
    "return_none": "return None",
    "return_bool": "return True",
    "return_nan": "return float('nan')",
    "return_inf": "return float('-inf')",
    "return_huge_int": "return 10**400",
    "return_slow_float": "class Slow:\n    def __float__(self):\n        while True:\n            pass\nreturn Slow()",
    "return_raising_float": "class Bad(float):\n    def __float__(self):\n        raise RuntimeError('no')\nreturn Bad(0.5)",
    # --- changing later calls -------------------------------------------------------------------------------
    "patch_builtin_float": "builtins.float = lambda *a: 1.0; builtins.isinstance = lambda *a: True; return 0.0",
    "patch_builtin_len_print": "builtins.len = lambda *a: 0; builtins.print = None; return 0.0",
    "patch_json": 'import json\njson.dumps = lambda *a, **k: \'{"id": 1, "results": [{"score": 1.0}]}\'\njson.loads = None\nreturn 0.0',
    "delete_builtins": "for name in list(vars(builtins)):\n    delattr(builtins, name)\nreturn 0.0",
    "patch_sys_modules": "sys.modules['math'] = None; sys.modules['json'] = None; return 0.0",
    "steal_next_request": "sys.stdin = open(0); return float(len(sys.stdin.readline()) > 0)",
    # --- the kernel -----------------------------------------------------------------------------------------
    "unshare_user": "return 1.0 if libc.unshare(0x10000000) == 0 else 0.0",
    "mount_tmpfs": "return 1.0 if libc.mount(b'none', b'/work', b'tmpfs', 0, None) == 0 else 0.0",
    "setuid_root": "os.setuid(0); return 1.0",
    "ptrace_attach": "return 1.0 if libc.ptrace(16, 1, 0, 0) == 0 else 0.0",
    "keyctl": "return 1.0 if libc.syscall(250, 0, 0, 0, 0, 0) >= 0 else 0.0",
    "bpf": "return 1.0 if libc.syscall(321, 0, 0, 0) >= 0 else 0.0",
}
