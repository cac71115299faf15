"""Side-by-side benchmark of Lockbox against its peers (run through scripts/compare-peers).

The same workload for every peer: store N small secrets (service + account -> ~40-byte value),
then read each back, timed per operation. Two ways:
  in-process   one process does all operations (what a long-running app or daemon sees);
  per process  one new process per operation (what a shell script or git/docker helper sees).
Reports medians and ratios as markdown, writes a JSON of all medians and a PNG chart.
Must run inside a private Secret Service session (scripts/secret-service run -- ...).
"""
import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SECRET = "secret-value-{}-0123456789abcdef"


def median_us(values_ns):
    return statistics.median(values_ns) / 1000.0


def timed_processes(commands, env=None):
    """Runs each (argv, stdin) once, returns wall-clock nanoseconds per process."""
    samples = []
    for argv, stdin in commands:
        start = time.perf_counter_ns()
        result = subprocess.run(argv, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        samples.append(time.perf_counter_ns() - start)
        if result.returncode != 0:
            sys.exit(f"compare-peers: {' '.join(argv[:3])}... failed ({result.returncode}): {result.stderr.decode()[:300]}")
    return samples


def json_child(argv, env=None):
    result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    if result.returncode != 0:
        sys.exit(f"compare-peers: {' '.join(argv[:3])} failed: {result.stderr.decode()[:500]}")
    return json.loads(result.stdout)


# In-process Python peers run in a child interpreter, so that each starts clean.
PYTHON_IN_PROCESS = r'''
import json, os, sys, time
count, service, kind = int(sys.argv[1]), sys.argv[2], sys.argv[3]
SECRET = "secret-value-{}-0123456789abcdef"
stores, reads = [], []
if kind in ("keyring-secretservice", "keyring-cryptfile"):
    if kind == "keyring-secretservice":
        from keyring.backends.SecretService import Keyring
        ring = Keyring()
    else:
        from keyrings.cryptfile.cryptfile import CryptFileKeyring
        ring = CryptFileKeyring()
        ring.file_path = os.environ["CRYPTFILE_PATH"]
        ring.keyring_key = "benchmark-passphrase"
    store = lambda i: ring.set_password(service, f"account-{i}", SECRET.format(i))
    read = lambda i: ring.get_password(service, f"account-{i}")
    cleanup = lambda i: ring.delete_password(service, f"account-{i}")
elif kind == "sqlite":
    import sqlite3
    db = sqlite3.connect(os.environ["SQLITE_PATH"], isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL"); db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS secrets (service TEXT, account TEXT, value BLOB, PRIMARY KEY (service, account))")
    store = lambda i: db.execute("INSERT INTO secrets VALUES (?, ?, ?)", (service, f"account-{i}", SECRET.format(i).encode()))
    read = lambda i: db.execute("SELECT value FROM secrets WHERE service = ? AND account = ?", (service, f"account-{i}")).fetchone()[0]
    cleanup = lambda i: db.execute("DELETE FROM secrets WHERE service = ? AND account = ?", (service, f"account-{i}"))
elif kind == "keyctl":
    import ctypes
    keyutils = ctypes.CDLL("libkeyutils.so.1")
    keyutils.add_key.restype = ctypes.c_int32
    keyutils.keyctl_search.restype = ctypes.c_long
    ring = int(os.environ["KEYCTL_RING"])
    buffer = ctypes.create_string_buffer(256)
    def store(i):
        value = SECRET.format(i).encode()
        if keyutils.add_key(b"user", f"{service}:account-{i}".encode(), value, len(value), ring) < 0: raise OSError("add_key")
    def read(i):
        key = keyutils.keyctl_search(ring, b"user", f"{service}:account-{i}".encode(), 0)
        if key < 0 or keyutils.keyctl_read(key, buffer, 256) < 0: raise OSError("keyctl_read")
        return buffer.raw
    cleanup = lambda i: None
for i in range(count):
    start = time.perf_counter_ns(); store(i); stores.append(time.perf_counter_ns() - start)
for i in range(count):
    start = time.perf_counter_ns(); value = read(i); reads.append(time.perf_counter_ns() - start)
    assert value
for i in range(count):
    cleanup(i)
print(json.dumps({"store": stores, "read": reads}))
'''

CRYPTFILE_ONE = r'''
import os, sys
from keyrings.cryptfile.cryptfile import CryptFileKeyring
ring = CryptFileKeyring(); ring.file_path = os.environ["CRYPTFILE_PATH"]; ring.keyring_key = "benchmark-passphrase"
if sys.argv[1] == "set": ring.set_password(sys.argv[2], sys.argv[3], sys.stdin.read())
else: print(ring.get_password(sys.argv[2], sys.argv[3]))
'''


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lockbox", required=True)
    parser.add_argument("--peer-bench", required=True)
    parser.add_argument("--libsecret-bench", required=True)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--slow-count", type=int, default=100, help="operations for peers that start a Python interpreter per process")
    parser.add_argument("--cryptfile-count", type=int, default=20,
                        help="operations for keyrings.cryptfile, which runs Argon2id on every operation (about a second here)")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    n, slow, cryptfile = args.count, args.slow_count, args.cryptfile_count
    work = tempfile.mkdtemp(prefix="lockbox-peers-")
    os.chmod(work, 0o700)
    env = dict(os.environ)
    env.update(XDG_DATA_HOME=f"{work}/data", XDG_STATE_HOME=f"{work}/state", PYTHONDONTWRITEBYTECODE="1")
    env["CRYPTFILE_PATH"] = f"{work}/cryptfile.cfg"
    env["SQLITE_PATH"] = f"{work}/floor.sqlite"
    vault = f"{work}/data/lockbox/bench.lockbox"
    lockbox = [args.lockbox, "--keychain", vault]
    python = sys.executable
    results = {}  # (peer, mode) -> {"store": us, "read": us, "operations": k}

    def record(peer, mode, samples, operations):
        results[(peer, mode)] = {"store": median_us(samples["store"]), "read": median_us(samples["read"]), "operations": operations}
        r = results[(peer, mode)]
        print(f"  {peer:32} {mode:12} store {r['store']:10.1f} us   read {r['read']:10.1f} us   ({operations} ops)", file=sys.stderr)

    def per_process(peer, store_cmd, read_cmd, count, penv=env):
        stores = timed_processes([store_cmd(i) for i in range(count)], penv)
        reads = timed_processes([read_cmd(i) for i in range(count)], penv)
        record(peer, "per process", {"store": stores, "read": reads}, count)

    subprocess.run(lockbox + ["init", "--passphrase-stdin", "--kdf", "interactive"], input=b"benchmark passphrase\n",
                   env=env, check=True, stdout=subprocess.DEVNULL)
    ss_env = dict(env, LOCKBOX_BACKEND="secret-service")
    py_ss_env = dict(env, PYTHON_KEYRING_BACKEND="keyring.backends.SecretService.Keyring")
    ring = subprocess.run(["keyctl", "newring", "lockbox-peer-bench", "@u"], capture_output=True, text=True, check=True).stdout.strip()
    env["KEYCTL_RING"] = ring
    try:
        print("in-process:", file=sys.stderr)
        record("Lockbox vault", "in-process", json_child([args.peer_bench, "--backend", "vault", "--keychain", vault, "--count", str(n)], env), n)
        record("Lockbox on Secret Service", "in-process",
               json_child([args.peer_bench, "--backend", "secret-service", "--count", str(n)], env), n)
        record("libsecret (C)", "in-process", json_child([args.libsecret_bench, str(n), "libsecret-in-process"], env), n)
        record("Python keyring (SecretService)", "in-process",
               json_child([python, "-c", PYTHON_IN_PROCESS, str(n), "py-ss", "keyring-secretservice"], env), n)
        record("keyrings.cryptfile", "in-process",
               json_child([python, "-c", PYTHON_IN_PROCESS, str(cryptfile), "py-cryptfile", "keyring-cryptfile"], env), cryptfile)
        record("kernel keyring (floor)", "in-process", json_child([python, "-c", PYTHON_IN_PROCESS, str(n), "kk", "keyctl"], env), n)
        record("raw SQLite (floor)", "in-process", json_child([python, "-c", PYTHON_IN_PROCESS, str(n), "sq", "sqlite"], env), n)

        print("one process per operation:", file=sys.stderr)
        # What a lockbox process pays before main: exec, the loader, the Swift runtime.
        startup = timed_processes([([args.lockbox, "--version"], None) for _ in range(n)], env)
        print(f"  lockbox --version              {median_us(startup):10.1f} us", file=sys.stderr)
        secret = lambda i: SECRET.format(i).encode()
        per_process("Lockbox vault",
                    lambda i: (lockbox + ["add-generic-password", "-s", "cli", "-a", f"account-{i}"], secret(i)),
                    lambda i: (lockbox + ["find-generic-password", "-s", "cli", "-a", f"account-{i}", "-w"], None), n)
        per_process("Lockbox on Secret Service",
                    lambda i: ([args.lockbox, "add-generic-password", "-s", "cli-ss", "-a", f"account-{i}"], secret(i)),
                    lambda i: ([args.lockbox, "find-generic-password", "-s", "cli-ss", "-a", f"account-{i}", "-w"], None), n, ss_env)
        subprocess.run(["secret-tool", "clear", "service", "cli-ss"], env=env)
        per_process("secret-tool (libsecret)",
                    lambda i: (["secret-tool", "store", "--label=peer benchmark", "service", "st", "account", f"account-{i}"], secret(i)),
                    lambda i: (["secret-tool", "lookup", "service", "st", "account", f"account-{i}"], None), n)
        subprocess.run(["secret-tool", "clear", "service", "st"], env=env)
        keyring_cli = [python, "-m", "keyring"]
        per_process("Python keyring (SecretService)",
                    lambda i: (keyring_cli + ["set", "py-cli", f"account-{i}"], secret(i)),
                    lambda i: (keyring_cli + ["get", "py-cli", f"account-{i}"], None), slow, py_ss_env)
        subprocess.run(["secret-tool", "clear", "service", "py-cli"], env=env)
        per_process("keyrings.cryptfile",
                    lambda i: ([python, "-c", CRYPTFILE_ONE, "set", "py-cli", f"account-{i}"], secret(i)),
                    lambda i: ([python, "-c", CRYPTFILE_ONE, "get", "py-cli", f"account-{i}"], None), cryptfile)
        per_process("kernel keyring (floor)",
                    lambda i: (["keyctl", "padd", "user", f"cli:account-{i}", ring], secret(i)),
                    lambda i: (["keyctl", "print", f"%user:cli:account-{i}"], None), n)
        floor = f"{work}/floor-cli.sqlite"
        subprocess.run(["sqlite3", floor, "PRAGMA journal_mode=WAL; CREATE TABLE secrets (service TEXT, account TEXT, value BLOB, PRIMARY KEY (service, account));"],
                       check=True, stdout=subprocess.DEVNULL)
        per_process("raw SQLite (floor)",
                    lambda i: (["sqlite3", floor, f"PRAGMA synchronous=FULL; INSERT INTO secrets VALUES ('cli', 'account-{i}', '{SECRET.format(i)}');"], None),
                    lambda i: (["sqlite3", floor, f"SELECT value FROM secrets WHERE service = 'cli' AND account = 'account-{i}';"], None), n)
    finally:
        subprocess.run(["keyctl", "unlink", ring, "@u"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)

    out = [{"peer": p, "mode": m, **v} for (p, m), v in results.items()]
    with open(args.json, "w") as handle:
        json.dump({"lockbox_version_process_us": median_us(startup), "count": n, "slow_count": slow, "cryptfile_count": cryptfile, "results": out}, handle, indent=1)


if __name__ == "__main__":
    main()
