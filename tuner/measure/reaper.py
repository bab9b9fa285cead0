"""Keep an engine from outliving the tuner: ``python -m tuner.measure.reaper --parent PID --pid-fd FD -- ARGV...``.

``ServerProcess`` starts every engine through this small process rather than directly, because a
tuner that is SIGKILLed (or dies of the OOM killer) runs no cleanup of its own. The reaper:

1. asks the kernel for SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``, Linux), and
   exits at once if the parent is already gone, closing the race between fork and prctl;
2. starts ARGV in its own session and process group (so a terminal's Ctrl-C reaches only the
   tuner, which decides), with the same parent-death signal set on the engine itself, should the
   reaper be killed first; and writes the engine's pid to ``--pid-fd``;
3. on SIGTERM (the tuner stopping it, or the parent-death signal), or when it sees its parent
   gone, stops the engine's group: SIGTERM, ``--grace`` seconds, then SIGKILL to the group and to
   every descendant it saw (engines fork workers that may leave the group);
4. when the engine exits by itself, kills what is left of its group and tree, then exits with the
   engine's own status (dying of the same signal), so ``ServerProcess.returncode()`` reads the
   engine's exit code exactly as before.

Only the standard library and psutil: it runs with the tuner's Python and imports nothing else.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from types import FrameType
from typing import IO

import psutil

PR_SET_PDEATHSIG = 1
POLL_S = 0.5
PID_WAIT_S = 60.0  # the reaper's own start; minutes only on a machine that is thrashing
KILL_WAIT_S = 10.0  # for SIGKILLed processes to be gone; milliseconds unless the machine is thrashing


def spawn(
    argv: Sequence[str], env: Mapping[str, str], log: IO[bytes], grace_s: float
) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``argv`` under a reaper (the tuner's side of this module); the reaper and the engine's pid.

    The pid is the reaper's own when the engine could not be started (the reaper then exits 127
    with the reason in the log)."""
    read_fd, write_fd = os.pipe()
    command = [sys.executable, "-m", "tuner.measure.reaper", "--parent", str(os.getpid()), "--pid-fd", str(write_fd)]
    command += ["--grace", str(grace_s), "--", *argv]
    try:
        try:
            proc = subprocess.Popen(  # an argv list: never through a shell
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=dict(env),
                start_new_session=True, pass_fds=(write_fd,), shell=False,
            )  # fmt: skip
        finally:
            os.close(write_fd)
        try:
            ready, _, _ = select.select([read_fd], [], [], PID_WAIT_S)
            text = os.read(read_fd, 64).decode() if ready else ""
        except BaseException:  # Ctrl-C before the caller holds the reaper: stop it (and its engine) here
            proc.terminate()
            raise
    finally:
        os.close(read_fd)
    return proc, int(text) if text.strip().isdigit() else proc.pid


def parent_death_signal(sig: int) -> None:
    """Have the kernel send ``sig`` to this process when its parent (thread) exits; Linux only."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the getppid() poll in supervise() still notices an orphaned reaper


class Reaper:
    def __init__(self, parent: int, grace_s: float) -> None:
        self.parent = parent
        self.grace_s = grace_s
        self.stopping = False
        self.tree: dict[int, psutil.Process] = {}

    def on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def remember(self, pid: int) -> None:
        try:
            self.tree.update((p.pid, p) for p in psutil.Process(pid).children(recursive=True))
        except psutil.Error:
            pass

    def supervise(self, child: subprocess.Popen[bytes]) -> int:
        """Wait for the engine; stop it when told to or when the parent is gone. Its exit status."""
        while True:
            self.remember(child.pid)
            try:
                return child.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
            if self.stopping or os.getppid() != self.parent:
                return self.stop(child)

    def stop(self, child: subprocess.Popen[bytes]) -> int:
        self.remember(child.pid)
        _signal_group(child.pid, signal.SIGTERM)
        try:
            return child.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(child.pid, signal.SIGKILL)
            return child.wait()

    def finish(self, pid: int) -> None:
        """SIGKILL whatever is left of the engine's group and of the descendants seen alive."""
        _signal_group(pid, signal.SIGKILL)
        kill_and_wait(self.tree.values())


def kill_and_wait(procs: Iterable[psutil.Process], timeout_s: float = KILL_WAIT_S) -> None:
    """SIGKILL each of ``procs`` and return once each is gone or a zombie (or ``timeout_s`` passed).

    A signal is delivered asynchronously: a worker that left the engine's session can still be
    running a moment after its SIGKILL, holding the GPU memory the next boot needs."""
    killed = []
    for proc in procs:
        try:
            proc.kill()  # psutil refuses if the pid was reused meanwhile
            killed.append(proc)
        except psutil.Error:
            pass
    deadline = time.monotonic() + timeout_s
    while any(map(_running, killed)) and time.monotonic() < deadline:
        time.sleep(0.02)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE  # an orphan's zombie waits on init, already dead
    except psutil.Error:
        return False


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _arm_engine() -> None:
    """Runs in the engine's process between fork and exec (the reaper has a single thread)."""
    parent_death_signal(signal.SIGTERM)


def exit_like(code: int) -> None:
    """Exit with the engine's status: the same code, or death by the same signal."""
    if code < 0:
        sig = -code
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be handled anyway
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(1.0)  # the signal is delivered before this ends; 128 + n if it was blocked
        os._exit(128 + sig)
    os._exit(code)


def main(argv: list[str]) -> None:
    if "--" not in argv:
        sys.exit("usage: python -m tuner.measure.reaper --parent PID --pid-fd FD [--grace S] -- ARGV...")
    opts, command = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    flags = dict(zip(opts[::2], opts[1::2], strict=False))
    reaper = Reaper(int(flags["--parent"]), float(flags.get("--grace", "10")))
    pid_fd = int(flags["--pid-fd"])
    signal.signal(signal.SIGTERM, reaper.on_stop)
    signal.signal(signal.SIGHUP, reaper.on_stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the tuner handles Ctrl-C and then stops us
    parent_death_signal(signal.SIGTERM)
    if os.getppid() != reaper.parent:
        os._exit(1)  # the tuner died before the death signal was armed: start nothing
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_arm_engine)
    except OSError as exc:
        print(f"tuner: cannot start {command[:1]}: {exc}", flush=True)  # into the trial's log
        os._exit(127)
    os.write(pid_fd, f"{child.pid}\n".encode())
    os.close(pid_fd)
    code = reaper.supervise(child)
    reaper.finish(child.pid)
    exit_like(code)


if __name__ == "__main__":
    main(sys.argv[1:])
