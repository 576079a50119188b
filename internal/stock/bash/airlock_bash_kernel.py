"""A Bash kernel for Jupyter, Airlock's: one bash process per kernel, kept
across cells (variables, functions, the working directory and exports
persist), each cell's output streamed as it comes. A cell that ends with a
non-zero status is an error (name ExitError, value "exit status N"), as a
failed cell is in the other languages. Built on ipykernel's Kernel, from
Debian's python3-ipykernel: no package index is needed to install it.
"""

import os
import select
import signal
import subprocess
import tempfile
import uuid

from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel


class BashKernel(Kernel):
    implementation = "airlock-bash"
    implementation_version = "1"
    language = "bash"
    language_version = "5"
    language_info = {"name": "bash", "mimetype": "text/x-sh", "file_extension": ".sh", "codemirror_mode": "shell"}
    banner = "Bash"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.bash = None
        self.cells = tempfile.mkdtemp(prefix="airlock-bash-")
        self.start_bash()

    def start_bash(self):
        # Its own process group is the kernel's: an interrupt the agent
        # sends to the group reaches what a cell runs.
        # The kernel ignores SIGINT but while a cell runs (ipykernel's
        # way), and an ignored signal stays ignored through exec, where no
        # shell may trap it: the shell starts with SIGINT's default.
        previous = signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            self.bash = subprocess.Popen(
                ["/bin/bash", "--noprofile", "--norc"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
            )
        finally:
            signal.signal(signal.SIGINT, previous)
        # An interrupt ends the cell (status 130), not the shell: the
        # command it reached dies of it, the handler returns from the
        # sourced cell, and the shell's state stays.
        self.bash.stdin.write(b"trap 'return 130 2>/dev/null' INT\n")

    def do_execute(self, code, silent, store_history=True, user_expressions=None, allow_stdin=False, *, cell_id=None):
        if self.bash.poll() is not None:
            self.start_bash()
            self.stream("stderr", "The shell had exited: a new one was started, and its state is lost.\n", silent)
        # The cell runs from a file, sourced with no stdin of its own, so
        # that a command reading stdin cannot eat what drives the shell.
        path = os.path.join(self.cells, "cell.sh")
        with open(path, "w") as f:
            f.write(code)
            f.write("\n")
        done = "__airlock_done_" + uuid.uuid4().hex
        self.bash.stdin.write(('. %s < /dev/null; printf "\\n%s %%d\\n" "$?"; printf "\\n%s\\n" >&2\n' % (path, done, done)).encode())
        status, err_tail = self.pump(done, silent)
        if status is None:  # the shell ended inside the cell (exit, or a signal)
            self.start_bash()
            status = 1
        if status == 0:
            return {"status": "ok", "execution_count": self.execution_count, "payload": [], "user_expressions": {}}
        err = {"ename": "ExitError", "evalue": "exit status %d" % status, "traceback": err_tail[-20:]}
        if not silent:
            self.send_response(self.iopub_socket, "error", err)
        return dict(err, status="error", execution_count=self.execution_count)

    def pump(self, done, silent):
        """Streams the cell's output until both streams report the end;
        returns the exit status (None if the shell ended) and the last
        lines of stderr."""
        outs = {self.bash.stdout.fileno(): ["stdout", b"", False], self.bash.stderr.fileno(): ["stderr", b"", False]}
        status, err_lines = None, []
        mark = ("\n" + done).encode()
        while not all(o[2] for o in outs.values()):
            try:
                ready, _, _ = select.select([fd for fd, o in outs.items() if not o[2]], [], [])
            except (InterruptedError, KeyboardInterrupt):
                continue  # the shell ends the cell and reports it
            for fd in ready:
                name, buf, _ = outs[fd]
                chunk = os.read(fd, 65536)
                if not chunk:
                    for o in outs.values():
                        o[2] = True
                    if buf:
                        self.stream(name, buf.decode(errors="replace"), silent)
                    return None, err_lines
                buf += chunk
                i = buf.find(mark)
                if i >= 0:
                    rest = buf[i + len(mark):]
                    if name == "stdout":
                        line = rest.split(b"\n", 2)
                        status = int(line[0].strip() or b"1")
                    outs[fd][2] = True
                    buf = buf[:i]
                    out, keep = buf, b""
                else:
                    # Hold back what could be the start of the mark.
                    cut = max(0, len(buf) - len(mark))
                    out, keep = buf[:cut], buf[cut:]
                if out:
                    text = out.decode(errors="replace")
                    if name == "stderr":
                        err_lines = (err_lines + text.splitlines(keepends=True))[-20:]
                    self.stream(name, text, silent)
                outs[fd][1] = keep
        return status, err_lines

    def stream(self, name, text, silent):
        if text and not silent:
            self.send_response(self.iopub_socket, "stream", {"name": name, "text": text})

    def do_shutdown(self, restart):
        if self.bash and self.bash.poll() is None:
            self.bash.kill()
        return {"status": "ok", "restart": restart}


if __name__ == "__main__":
    IPKernelApp.launch_instance(kernel_class=BashKernel)
