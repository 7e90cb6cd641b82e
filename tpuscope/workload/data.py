"""A synthetic token pipeline on a background thread, standing in for a real input pipeline.

Each batch takes ``latency`` seconds to "read" (sleeping, as a storage read
would) and is prefetched into a small queue, so the training loop waits only
when the pipeline falls behind: that wait is the honest ``io`` phase.
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np


class TokenPipeline:
    def __init__(self, batch: int, vocab: int, latency: float = 0.0, prefetch: int = 2, seed: int = 0) -> None:
        self.batch = batch
        self.vocab = vocab
        self.latency = latency
        self._rng = np.random.default_rng(seed)
        self._requests: queue.Queue[int | None] = queue.Queue()
        self._batches: queue.Queue[np.ndarray] = queue.Queue(maxsize=prefetch)
        self._thread = threading.Thread(target=self._produce, name="tpuscope-data", daemon=True)
        self._thread.start()
        self._in_flight = 0  # batches asked for and not yet taken

    def _produce(self) -> None:  # the only user of self._rng: numpy generators are not thread-safe
        while (seq_len := self._requests.get()) is not None:
            time.sleep(self.latency)
            self._batches.put(self._make(seq_len))

    def _make(self, seq_len: int) -> np.ndarray:
        """Sequences with structure a model can learn: each token follows from the previous one."""
        start = self._rng.integers(0, self.vocab, size=(self.batch, 1))
        stride = self._rng.integers(1, 4, size=(self.batch, 1))
        return ((start + stride * np.arange(seq_len)) % self.vocab).astype(np.int32)

    def next(self, seq_len: int) -> np.ndarray:
        """The next batch of shape (batch, seq_len), waiting for it if the pipeline is behind.

        Keeps ``prefetch`` requests in flight, all of the length asked for now. Batches
        prefetched at an older length are dropped, and the wait for their replacements
        is io time, as it would be in a real pipeline after a shape change.
        """
        while True:
            while self._in_flight < self._batches.maxsize:
                self._requests.put(seq_len)
                self._in_flight += 1
            tokens = self._batches.get()
            self._in_flight -= 1
            if tokens.shape[1] == seq_len:
                return tokens

    def close(self) -> None:
        self._requests.put(None)
