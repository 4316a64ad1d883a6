"""A small desktop window (Tk) that streams an answer from edge.

    python examples/tk_stream.py [--model smollm2-135m] [--prompt "Why is the sky blue?"]

The model runs in a worker thread; Tk is not thread-safe, so the worker only puts text pieces on a queue and
the window drains it with `after()`. "Stop" sets a `threading.Event` the generation polls between tokens.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import tkinter as tk
from collections.abc import Callable
from typing import Any

import edge

END = None  # put on the queue when a generation ends


def stream_answer(
    model: Any, prompt: str, put: Callable[[str | None], None], cancel: threading.Event, **options: Any
) -> edge.Result:
    """The part without a UI: stream the answer's pieces into `put` (END last) and return the Result."""
    stream = model.stream(prompt, cancel=cancel, **options)
    try:
        for piece in stream:
            put(piece)
    finally:
        put(END)
    assert stream.result is not None
    return stream.result


class StreamWindow:
    def __init__(self, root: tk.Tk, model: edge.Model, **options: Any) -> None:
        self.root, self.model, self.options = root, model, options
        self.pieces: queue.Queue[str | None] = queue.Queue()
        self.cancel = threading.Event()
        self.busy = False
        self.on_done: Callable[[edge.Result], None] | None = None
        self.result: edge.Result | None = None

        root.title(f"edge: {model.name} on {model.backend}:{model.device}")
        top = tk.Frame(root)
        top.pack(fill="x", padx=6, pady=6)
        self.prompt = tk.Entry(top)
        self.prompt.pack(side="left", fill="x", expand=True)
        self.prompt.bind("<Return>", lambda _: self.ask())
        tk.Button(top, text="Ask", command=self.ask).pack(side="left", padx=4)
        tk.Button(top, text="Stop", command=self.cancel.set).pack(side="left")
        self.text = tk.Text(root, wrap="word", height=16, width=72)
        self.text.pack(fill="both", expand=True, padx=6)
        self.status = tk.Label(root, anchor="w", text="ready")
        self.status.pack(fill="x", padx=6, pady=(0, 6))

    def ask(self, prompt: str | None = None) -> None:
        if self.busy:
            return
        prompt = prompt if prompt is not None else self.prompt.get()
        if not prompt.strip():
            return
        self.busy = True
        self.cancel.clear()
        self.text.delete("1.0", "end")
        self.status.config(text="generating…")
        threading.Thread(target=self._work, args=(prompt,), daemon=True).start()
        self.root.after(30, self._drain)

    def _work(self, prompt: str) -> None:  # worker thread: no Tk calls here
        self.result = stream_answer(self.model, prompt, self.pieces.put, self.cancel, **self.options)

    def _drain(self) -> None:  # Tk thread
        while True:
            try:
                piece = self.pieces.get_nowait()
            except queue.Empty:
                self.root.after(30, self._drain)
                return
            if piece is END:
                break
            self.text.insert("end", piece)
            self.text.see("end")
        self.busy = False
        r = self.result
        if r is not None:
            s = r.stats
            self.status.config(
                text=f"{s.n_tokens} tokens ({s.stop_reason}) · TTFT {s.ttft_ms:.0f} ms · "
                f"{s.decode_tok_s:.1f} tok/s · {r.backend}:{r.device}"
            )
            if self.on_done is not None:
                self.on_done(r)

    def shown_text(self) -> str:
        return self.text.get("1.0", "end-1c")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompt", default=None, help="ask this at start")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--exit-when-done", action="store_true", help="print the shown answer and exit (tests)")
    args = ap.parse_args(argv)

    with edge.load(args.model) as model:
        root = tk.Tk()
        win = StreamWindow(root, model, max_tokens=args.max_tokens, temperature=args.temperature)
        if args.exit_when_done:

            def done(_: edge.Result) -> None:
                root.update()
                print(win.shown_text())
                root.after(300, root.destroy)  # a moment on screen, for a screenshot

            win.on_done = done
        if args.prompt:
            win.prompt.insert(0, args.prompt)
            root.after(100, win.ask)
        root.mainloop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
