"""SIGTERM is Ctrl-C to the CLI (``tuner.cli.main``), also when it lands inside a request's task."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A drive in miniature: one task of four sends the process SIGTERM itself, so the handler runs inside
# that task, as on the H100 when `finish.sh` stopped a search mid-request (its KeyboardInterrupt then
# ended the task, and the gathering drive kept it: "Task exception was never retrieved").
_DRIVE = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from tuner.cli.main import _interrupt

    async def unit(i):
        await asyncio.sleep(0.05 * i)
        if i == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            sum(range(1000))  # the handler runs here, in this task's frame
        await asyncio.sleep(30)

    async def drive():
        tasks = [asyncio.create_task(unit(i)) for i in range(4)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            print("drive cleaned up", file=sys.stderr)

    signal.signal(signal.SIGTERM, _interrupt)
    try:
        asyncio.run(drive())
    except KeyboardInterrupt as exc:
        print(f"interrupted: {exc}", file=sys.stderr)
    """
)


def test_sigterm_inside_a_task_interrupts_the_run_without_a_stray_traceback() -> None:
    done = subprocess.run([sys.executable, "-c", _DRIVE], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["drive cleaned up", "interrupted: signal 15"], done.stderr


def test_sigterm_outside_an_event_loop_is_keyboard_interrupt_at_once() -> None:
    script = textwrap.dedent(
        """
        import os, signal, sys, time
        from tuner.cli.main import _interrupt
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        except KeyboardInterrupt as exc:
            print(f"interrupted: {exc}", file=sys.stderr)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0 and done.stderr.strip() == "interrupted: signal 15", done.stderr
