"""A preallocated key/value cache for autoregressive decoding.

Book: part II, "Autoregressive decoding and the KV cache" (what is cached and why it is exact);
part II, "MQA and GQA" (why the cache holds n_kv_heads heads, not n_heads).

``KVCache`` has one job: hold the keys and values of the positions decoded so far, in two buffers
allocated once, and hand back views of the filled prefix. ``MultiHeadAttention.forward(..., kv_cache=cache)``
calls :meth:`KVCache.append`; nothing else writes to it.

Design choices
--------------
* A plain class, not an ``nn.Module``. The cache is decoding *state*, not model *parameters*: it should not appear in
  ``model.parameters()``/``state_dict()``, and ``model.to(torch.bfloat16)`` should not silently convert a cache the
  caller built and passes explicitly on every call. The buffers are made once with the dtype and device asked for;
  to decode on another device or dtype, build another cache (cheap: two ``torch.zeros``).
* ``length`` is a Python ``int`` kept on the host. Every shape the forward pass needs (the filled prefix, the causal
  mask's offset, the overflow check) is then known without reading a device tensor: no host-device synchronisation.
  (Under ``torch.compile`` each new length is a new shape; gpt-fast instead attends over the whole buffer with a
  position mask. We slice because it is exact and simple, and the book measures the cost, not compile behaviour.)
* Every check happens before anything is written: a rejected ``append`` leaves the cache exactly as it was.
* A forward call that fails after its append (an error inside the attention kernel, out of memory, a
  ``KeyboardInterrupt``) leaves the cache as it was too: ``MultiHeadAttention`` sets ``length`` back. The append
  wrote only at positions >= the old ``length``, which are never read (every read is of the filled prefix) and the
  next call overwrites, so ``length`` and the filled prefix are as they were and a retry gives the right answer.
* A cache holds one layer's keys and values: once a module has written positions to it, another module is refused
  (it would read the first one's keys) until :meth:`reset`. ``length`` may be set by hand (to rewind), but only to an
  integer in ``[0, max_len]``.
* ``append`` writes in place; under autograd the buffers then carry a graph. Decoding is meant to run under
  ``torch.no_grad()`` / ``torch.inference_mode()``.

The ring buffer (``window=W``)
------------------------------
A layer with a sliding window of W (query at position p sees keys p - W < j <= p) never reads a key older than W - 1
positions, so its cache needs only the most recent ones: ``KVCache(..., window=W)`` holds ``n_sink_tokens + W``
slots however long the generation, and ``max_len`` is then only the longest generation (the positions it counts up
to), not the buffers' size.

* Slots ``0 .. S-1`` (S = ``n_sink_tokens``) keep positions ``0 .. S-1`` for ever: StreamingLLM's attention sinks
  (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks"): the first tokens collect a large
  share of attention, so evicting them hurts; StreamingLLM keeps 4 of them plus a window of recent tokens.
  Position p >= S goes to slot ``S + (p - S) % W``. After ``length`` positions the ring holds positions
  ``max(S, length - W) .. length - 1`` (and the sink slots positions ``0 .. min(S, length) - 1``).
* Positions: every key keeps its original absolute position (it is stored rotated by RoPE at that position, and the
  window mask compares absolute positions). StreamingLLM instead re-numbers the cache (positions "within the
  cache": the window's keys are re-rotated to sit right after the sinks), so its model never sees a distance larger
  than the cache; we do not, so that ring-buffer decoding equals the full computation with the mask
  "p - W < j <= p, or j < S" exactly (up to summation order), which the tests check.
* Exactness: a chunk of T new queries at positions L .. L+T-1 attends over every slot *followed by* its own T keys
  (:meth:`window_keys`, nothing written), with a mask built from the absolute position each slot holds
  (:meth:`slot_positions`, computed from ``length`` on the device: no host-device synchronisation). A query at q >= L
  needs the cached keys j with q - W < j < L, all >= L - W + 1, which the ring holds; the rest (older keys, empty
  slots) are masked out. Same keys, values and scores as the full cache, so the same softmax. Only after the call
  has succeeded are the new keys written (:meth:`commit`: the last W of them, since earlier ones would be
  overwritten by later ones of the same chunk). A prefill longer than W, chunked prefill and one-token steps past
  many wraps are then all the same computation.
* A failed call therefore leaves the ring exactly as it was: nothing was written. (Setting ``length`` back, as
  the full cache does, would not be enough: a write overwrites old slots.) ``length`` may be set back by hand only
  as far as the ring still holds every key the next query needs (one position, or all the way while nothing has
  wrapped); further is refused.
"""

from __future__ import annotations

import weakref

import torch

from mha._checks import check_int, check_like, check_type

__all__ = ["KVCache"]


class KVCache:
    """Keys and values of the positions decoded so far, preallocated to ``max_len`` positions.

    Book: part II, "Autoregressive decoding and the KV cache".

    Args:
        batch_size: N, the number of sequences decoded together.
        max_len: the most positions the cache can hold (prompt plus generated tokens). With a window: the longest
            generation, the positions ``length`` counts up to, not the buffers' size (which is
            ``n_sink_tokens + window`` slots whatever ``max_len`` is).
        n_kv_heads: g, the number of key/value heads (``MultiHeadAttention.n_kv_heads``; g < n_heads for GQA/MQA).
        head_dim: the size of one key/value head.
        dtype: floating dtype of the buffers; must equal the attention module's dtype.
        device: device of the buffers (a str, a ``torch.device`` or None for torch's default); must be one torch
            can allocate on here and equal the attention module's device.
        window: None (a full cache) or W >= 1: a ring buffer for a module with ``window=W`` (the two must agree;
            see the module docstring). ``MultiHeadAttention.new_cache`` builds the right one.
        n_sink_tokens: with a window, how many first positions are kept for ever (StreamingLLM), in [0, window).

    Attributes:
        k, v: the buffers, each ``(batch_size, n_kv_heads, max_len, head_dim)``, or with a window
            ``(batch_size, n_kv_heads, n_sink_tokens + window, head_dim)`` (slot order, see :meth:`slot_positions`).
        length: the number of positions written (a Python ``int`` in ``[0, max_len]``; settable, to rewind).
    """

    def __init__(self, batch_size: int, max_len: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device=None, *, window: int | None = None,
                 n_sink_tokens: int = 0):
        for name, value in [("batch_size", batch_size), ("max_len", max_len),
                            ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)]:
            check_int(name, value)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        if window is not None:
            window = check_int("window", window, minimum=1)
            n_sink_tokens = check_int("n_sink_tokens", n_sink_tokens, minimum=0, maximum=window - 1)
        elif check_int("n_sink_tokens", n_sink_tokens, minimum=0) != 0:
            raise ValueError(f"n_sink_tokens needs a window (a ring buffer): got n_sink_tokens={n_sink_tokens} with "
                             f"window=None; a full cache keeps every position anyway")
        self.batch_size = batch_size
        self.max_len = max_len
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.window = window  # None: a full cache; W: a ring buffer of W slots (plus the sink slots)
        self.n_sink_tokens = n_sink_tokens  # S: the first S positions, kept for ever (window caches only)
        parsed = _check_device(device)
        slots = max_len if window is None else n_sink_tokens + window
        shape = (batch_size, n_kv_heads, slots, head_dim)  # (N, g, max_len or S + W, head_dim)
        try:
            self.k = torch.zeros(shape, dtype=dtype, device=parsed)
            self.v = torch.zeros(shape, dtype=dtype, device=parsed)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as err:  # a backend torch knows but this machine lacks (mps, xpu, ...): torch's errors vary
            reason = (str(err).splitlines() or [type(err).__name__])[0].split(". ")[0]  # torch's first sentence
            raise ValueError(f"device must be a device torch can allocate on here, got {device!r} ({reason})") from err
        self._length = 0
        self._owner = None  # weakref to the module whose keys/values fill the cache (None: no owner yet)

    @property
    def length(self) -> int:
        """The number of positions filled, in ``[0, max_len]``; may be set by hand (to rewind), within that range."""
        return self._length

    @length.setter
    def length(self, value: int) -> None:
        if not (type(value) is int and 0 <= value <= self.max_len):  # the common case, without check_int's message
            value = check_int("length", value, minimum=0, maximum=self.max_len)
        if self.window is not None and value < self._length:
            self._check_rewind(value)
        self._length = value

    def _check_rewind(self, value: int) -> None:
        """A ring buffer can be set back to ``value`` only if it still holds every key a query at ``value`` needs."""
        s, w, length = self.n_sink_tokens, self.window, self._length
        if value <= s or max(s, value - w + 1) >= max(s, length - w):
            return
        raise ValueError(f"length cannot be set back from {length} to {value} on a ring-buffer KVCache "
                         f"(window={w}): positions {max(s, value - w + 1)} .. {max(s, length - w) - 1}, which a "
                         f"query at position {value} needs, were overwritten; it can go back to "
                         f"{length - 1}, or to {s} or below (call reset() to start over)")

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def nbytes(self) -> int:
        """Bytes held by the two buffers: ``2 * batch_size * n_kv_heads * max_len * head_dim * itemsize`` (with a
        window, ``n_sink_tokens + window`` slots instead of ``max_len``).

        Book: part II, "Counting everything" (the KV-cache memory term) and "MQA and GQA" (it shrinks by h / g).
        """
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def check_append(self, batch_size: int, n_new: int, n_kv_heads: int, head_dim: int,
                     dtype: torch.dtype, device: torch.device, who: str = "k_new", owner=None) -> None:
        """Raise if ``n_new`` positions of this shape/dtype/device cannot be appended; touches nothing.

        ``MultiHeadAttention`` calls this before projecting, so a bad call fails before any computation. ``owner``:
        the module about to write (None: no ownership check); refused when the cache holds positions written by
        another module.
        """
        if owner is not None and self._length > 0 and self._owner is not None and self._owner() is not owner:
            raise ValueError("kv_cache holds keys/values written by another MultiHeadAttention (one KVCache holds one "
                             "layer's keys and values; this layer would attend over the other's): give each layer its "
                             "own KVCache, or call kv_cache.reset() before reusing it for another module")
        expected = (self.batch_size, self.n_kv_heads, "T", self.head_dim)
        got = (batch_size, n_kv_heads, n_new, head_dim)
        if batch_size != self.batch_size:
            raise ValueError(f"{who} has batch size {batch_size} but the KVCache was built for "
                             f"batch_size {self.batch_size} (shape {got}, expected {expected})")
        if n_kv_heads != self.n_kv_heads:
            raise ValueError(f"{who} has {n_kv_heads} key/value heads but the KVCache was built for "
                             f"n_kv_heads {self.n_kv_heads} (shape {got}, expected {expected})")
        if head_dim != self.head_dim:
            raise ValueError(f"{who} has head_dim {head_dim} but the KVCache was built for "
                             f"head_dim {self.head_dim} (shape {got}, expected {expected})")
        if dtype != self.dtype:
            raise TypeError(f"{who} has dtype {dtype} but the KVCache holds {self.dtype}")
        if torch.device(device) != self.device:
            raise ValueError(f"{who} is on device {device} but the KVCache is on {self.device}")
        if self.length + n_new > self.max_len:
            raise ValueError(f"KVCache overflow: {self.length} cached + {n_new} new > max_len {self.max_len}")

    def append(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k_new``, ``v_new`` (each ``(N, g, T, head_dim)``) after the filled prefix.

        Returns views ``(k_all, v_all)``, each ``(N, g, length, head_dim)``, of everything cached so far (the new
        positions included). Raises, writing nothing, on a shape/dtype/device mismatch or on overflow.

        With a window: writes the new positions into the ring and returns views of the whole buffers, each
        ``(N, g, n_sink_tokens + window, head_dim)``, in slot order (:meth:`slot_positions` says which position each
        slot holds; the new positions older than the window are not kept).
        """
        for name, t in [("k_new", k_new), ("v_new", v_new)]:
            check_type(name, t, torch.Tensor, "a torch.Tensor")
            if t.ndim != 4:
                raise ValueError(f"{name} must be 4-D (N, n_kv_heads, T, head_dim), got shape {tuple(t.shape)}")
        if k_new.shape != v_new.shape:
            raise ValueError(f"k_new and v_new must have the same shape, got {tuple(k_new.shape)} and "
                             f"{tuple(v_new.shape)}")
        check_like("v_new", v_new, "k_new", k_new)
        n, g, t, d = k_new.shape
        self.check_append(n, t, g, d, k_new.dtype, k_new.device)
        if self.window is not None:
            self.commit(k_new, v_new)
            return self.k, self.v  # each (N, g, S + W, head_dim), slot order
        start, stop = self.length, self.length + t
        self.k[:, :, start:stop] = k_new  # (N, g, T, head_dim) into (N, g, max_len, head_dim)
        self.v[:, :, start:stop] = v_new
        self.length = stop
        return self.k[:, :, :stop], self.v[:, :, :stop]  # each (N, g, length, head_dim)

    # ------------------------------------------------------------------------------------------ the ring buffer
    def slot_positions(self, length: int | None = None) -> torch.Tensor:
        """(n_slots,) int64 on the cache's device: the absolute position each slot holds after ``length`` (default:
        the current length) positions, -1 for an empty slot. Computed from host integers, without reading the device.

        Window caches only. Sink slot i holds position i (once written); ring slot r holds the latest position
        p < length with p >= S and (p - S) % W == r.
        """
        if self.window is None:
            raise ValueError("slot_positions is for ring-buffer caches (window=...); a full cache's slot i holds "
                             "position i")
        length = self._length if length is None else length
        s, w = self.n_sink_tokens, self.window
        sinks = torch.arange(s, device=self.device)  # (S,)
        sinks = torch.where(sinks < length, sinks, -1)
        r = torch.arange(w, device=self.device)  # (W,)
        back = length - 1 - s - r  # how far behind the newest position slot r's residue class is
        ring = torch.where(back >= 0, s + r + w * torch.div(back, w, rounding_mode="floor"), -1)  # (W,)
        return torch.cat([sinks, ring])  # (S + W,)

    def window_keys(self, k_new: torch.Tensor, v_new: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What a call with keys/values ``k_new``, ``v_new`` (N, g, T, head_dim) attends over, writing nothing:
        ``(k_all, v_all, key_positions)``, every slot followed by the T new keys, each (N, g, S + W + T, head_dim),
        and their absolute positions (S + W + T,) (-1: empty slot). Window caches only; see the module docstring."""
        t = k_new.shape[2]
        new_positions = torch.arange(self._length, self._length + t, device=self.device)  # (T,)
        positions = torch.cat([self.slot_positions(), new_positions])  # (S + W + T,)
        return torch.cat([self.k, k_new], dim=2), torch.cat([self.v, v_new], dim=2), positions

    def commit(self, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        """Write the T new positions ``length .. length+T-1`` into a ring buffer and advance ``length`` (the caller has
        checked the shapes with :meth:`check_append`). Sink positions go to their own slots; of the others only the
        last W are written (at most two slices: the ring wraps at most once)."""
        s, w, start, t = self.n_sink_tokens, self.window, self._length, k_new.shape[2]
        stop = start + t
        if stop > self.max_len:
            raise ValueError(f"KVCache overflow: {start} cached + {t} new > max_len {self.max_len}")
        writes = []  # (slot_start, slot_stop, new_start): k_new[:, :, new_start:...] -> slots
        if start < s:
            writes.append((start, min(stop, s), 0))
        first = max(start, s, stop - w)  # the oldest new ring position still kept
        if first < stop:
            slot = s + (first - s) % w
            head = min(stop - first, s + w - slot)  # up to the end of the ring, then wrap to slot s
            writes.append((slot, slot + head, first - start))
            if head < stop - first:
                writes.append((s, s + stop - first - head, first - start + head))
        for a, b, i in writes:
            self.k[:, :, a:b] = k_new[:, :, i:i + b - a]  # (N, g, b - a, head_dim)
            self.v[:, :, a:b] = v_new[:, :, i:i + b - a]
        self._length = stop

    def _claim(self, owner) -> None:
        """Record ``owner`` (a module) as the one whose keys/values fill the cache; ``MultiHeadAttention`` calls this
        once its call has succeeded, and :meth:`check_append` refuses other modules until :meth:`reset`."""
        if self._owner is None or self._owner() is not owner:
            self._owner = weakref.ref(owner)  # weak: the cache does not keep a deleted model alive

    def reset(self) -> None:
        """Forget every cached position and the module that wrote them (the buffers are kept, not zeroed: only the
        prefix, or with a window the slots holding positions, is ever read)."""
        self._length = 0
        self._owner = None

    def __getstate__(self) -> dict:
        """Pickling and copying keep everything but the owner (a weak reference, which cannot be pickled)."""
        return {**self.__dict__, "_owner": None}

    def __repr__(self) -> str:
        ring = "" if self.window is None else f", window={self.window}, n_sink_tokens={self.n_sink_tokens}"
        return (f"KVCache(batch_size={self.batch_size}, max_len={self.max_len}, n_kv_heads={self.n_kv_heads}, "
                f"head_dim={self.head_dim}, dtype={self.dtype}, device={self.device}, length={self.length}{ring})")


def _check_device(device) -> torch.device | None:
    """``device`` as a ``torch.device`` (None stays None: torch's default), or raise before anything is allocated.

    TypeError for another type, ValueError for a string torch does not parse and for CUDA where it is not available
    (torch itself raises an AssertionError there).
    """
    if device is None:
        return None
    check_type("device", device, (str, torch.device), "a str, a torch.device or None")
    try:
        parsed = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device must be a device such as 'cpu', 'cuda', 'cuda:1', 'mps' or 'meta', got {device!r}") \
            from err
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device must be a device torch can allocate on here, got {device!r} (CUDA is not "
                             f"available: torch.cuda.is_available() is False)")
        if parsed.index is not None and parsed.index >= count:
            raise ValueError(f"device must be a device torch can allocate on here, got {device!r} (this machine has "
                             f"{count} CUDA device(s): cuda:0 to cuda:{count - 1})")
    return parsed
