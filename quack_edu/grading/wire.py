"""Plain data between the grader and a learner process: JSON with typed leaves, never pickle.

``encode`` keeps only the data of a value (numbers, strings, lists, dicts, dtypes, tensors'
bytes); ``decode`` rebuilds it in the grader. An object whose ``==`` is always true, or a
tensor subclass that lies about its values, cannot cross: what arrives is built here.
"""

from __future__ import annotations

import base64


class Unencodable(TypeError):
    pass


def encode(v, _depth: int = 0):
    """A JSON-able form of ``v`` that keeps only its data (see ``decode``)."""
    import torch

    if _depth > 32:
        raise Unencodable("nested too deep")
    if v is None or type(v) in (str, bool):
        return v
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return {"t": "int", "v": str(int.__index__(v))}
    if isinstance(v, float):
        return {"t": "float", "v": float.hex(float.__float__(v))}
    if isinstance(v, str):
        return str.__str__(v)
    if isinstance(v, torch.Tensor):
        t = v.detach().to("cpu").contiguous()
        t = torch.Tensor.as_subclass(t, torch.Tensor)
        # (a 0-d tensor has no dim to view as bytes: its one element is viewed as a row)
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return {
            "t": "tensor",
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
            "device": v.device.type,
            "data": base64.b64encode(raw).decode(),
        }
    if isinstance(v, torch.dtype):
        return {"t": "dtype", "v": str(v).removeprefix("torch.")}
    if isinstance(v, list | tuple):
        return {
            "t": "tuple" if isinstance(v, tuple) else "list",
            "v": [encode(x, _depth + 1) for x in v],
        }
    if isinstance(v, dict) and all(type(k) is str for k in v):
        return {"t": "dict", "v": {k: encode(x, _depth + 1) for k, x in v.items()}}
    try:  # numpy and torch scalars
        import numbers

        if isinstance(v, numbers.Integral):
            return encode(int(v), _depth + 1)
        if isinstance(v, numbers.Real):
            return encode(float(v), _depth + 1)
    except (TypeError, ValueError):
        pass
    raise Unencodable(f"{type(v).__module__}.{type(v).__qualname__}")


def decode(d, device_ok: bool = True):
    """Plain Python values and torch tensors from ``encode``'s form (in the grader)."""
    import torch

    if d is None or type(d) in (str, bool):
        return d
    if type(d) is not dict:
        raise ValueError(f"not an encoded value: {type(d).__name__}")
    t = d.get("t")
    if t == "int":
        return int(str(d["v"]))
    if t == "float":
        return float.fromhex(str(d["v"]))
    if t in ("list", "tuple"):
        out = [decode(x, device_ok) for x in d["v"]]
        return tuple(out) if t == "tuple" else out
    if t == "dict":
        return {str(k): decode(x, device_ok) for k, x in d["v"].items()}
    if t == "dtype":
        dt = getattr(torch, str(d["v"]), None)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"no dtype {d['v']!r}")
        return dt
    if t == "tensor":
        dt = getattr(torch, str(d["dtype"]), None)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"no dtype {d['dtype']!r}")
        shape = [int(s) for s in d["shape"]]
        raw = base64.b64decode(d["data"])
        n = 1
        for s in shape:
            n *= s
        itemsize = torch.empty((), dtype=dt).element_size()
        if len(raw) != n * itemsize:
            raise ValueError("tensor bytes do not match its shape")
        if n == 0:
            out = torch.empty(shape, dtype=dt)
        else:
            out = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dt).reshape(shape)
        if d.get("device") == "cuda" and device_ok and torch.cuda.is_available():
            out = out.cuda()
        return out
    raise ValueError(f"unknown encoded type {t!r}")
