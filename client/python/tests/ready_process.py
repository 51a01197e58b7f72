"""A service process for the client's stack tests: started, waited for until
its READY line (`NAME_READY key=value ...`) appears on stdout, stopped.

A reader thread copies the process's output into a log file and sets an event
when the READY line arrives or the output ends, so the wait blocks on that
event: no polling. Standard library only: the installed-package test imports
it from a fresh venv, the Bazel test through //client/python:ready_process.
"""

import re
import subprocess
import tempfile
import threading

START_S = 60.0  # bound on a process's start-up


class ReadyProcess:
    """`argv` started with stdout and stderr to a log; `fields` holds the READY line's key=value pairs."""

    def __init__(self, name, argv, ready, log_dir=None, start_s=START_S):
        self.log = tempfile.NamedTemporaryFile(prefix=name, suffix=".log", dir=log_dir, delete=False)
        self.fields = None
        self._event = threading.Event()
        self._pattern = re.compile(re.escape(ready) + r"(.*)")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._reader = threading.Thread(target=self._copy, daemon=True)
        self._reader.start()
        if not self._event.wait(start_s) or self.fields is None:
            self.stop()
            raise RuntimeError("%s did not start: %s" % (name, self.output()))

    def _copy(self):
        for line in self.proc.stdout:
            self.log.write(line)
            self.log.flush()
            if self.fields is None:
                m = self._pattern.search(line.decode("utf-8", errors="replace"))
                if m:
                    self.fields = dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv)
                    self._event.set()
        self._event.set()  # the output ended: the process exited without a READY line

    def output(self):
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self):
        """SIGTERM, as an operator stops a service; what went wrong ([] when
        it exited 0 within 20 s and its output holds no sanitizer report)."""
        problems = []
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                problems.append("still running 20 s after SIGTERM: killed")
        self._reader.join(timeout=5)
        if self.proc.returncode != 0 and not problems:
            problems.append("exited with %d on SIGTERM" % self.proc.returncode)
        out = self.output()
        at = out.find("Sanitizer")
        if at >= 0:
            problems.append("a sanitizer report in its output:\n" + out[out.rfind("\n", 0, at) + 1:][:6000])
        return problems
