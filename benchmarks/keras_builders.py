"""Small random Keras 3 models, one builder per op family, for the Keras randomized suite (keras_families.py).

Each builder takes a ``random.Random`` (every choice of the configuration is drawn from it) and returns a
:class:`Body`: the model's inputs, its layers (a ``keras.Sequential``) or its graph (a functional model) and a
one-line description of the draw. :func:`assemble` adds a drawn head for the case's loss, compiles the model and
draws its data. Nothing here reads the Keras backend, so a seed draws the same model on every backend. Models
are kept small (parameters well under 2 M) so that a step measures in a few seconds. ``FAMILIES`` is the one
registry of family names; ``LOSSES`` and ``OPTIMIZERS`` the ones of the losses and optimizers drawn.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["FAMILIES", "LOSSES", "OPTIMIZERS", "Body", "Built", "Family", "Feed", "assemble"]

OPTIMIZERS = ("adam", "sgd", "rmsprop")  # Keras's own names (and nnmem.optimizers'), compiled as strings
LOSSES: dict[str, tuple[str | None, str]] = {  # Keras loss name → (activation of the head's last Dense, label)
    "mse": (None, "mse"), "mae": (None, "mae"), "huber": (None, "huber"),
    "sparse_categorical_crossentropy": ("softmax", "sparse_cce"),
    "categorical_crossentropy": ("softmax", "cce"), "binary_crossentropy": ("sigmoid", "bce")}
_ACTS = ("relu", "gelu", "silu", "tanh", "sigmoid", "elu", "selu", "softplus", "leaky_relu", "relu6", "mish",
         "linear")
_FLATTEN_MAX = 16384  # features flattened into the head at most: its Dense stays under ~200 k parameters


@dataclass(frozen=True, slots=True)
class Feed:
    """One model input: its shape without the batch, and for integer inputs the exclusive upper bound."""

    shape: tuple[int, ...]
    high: int = 0  # > 0: int32 token ids in [0, high)


@dataclass(frozen=True, slots=True)
class Body:
    """A drawn model body: ``layers`` for a Sequential model, or ``graph`` (inputs → features) for a functional one."""

    feeds: tuple[Feed, ...]
    config: str
    layers: tuple[Any, ...] = ()
    graph: Callable[[list[Any]], Any] | None = field(default=None)


@dataclass(frozen=True, slots=True)
class Built:
    """A compiled model with its inputs ``x`` and target ``y``; ``config`` describes the draw in one line."""

    model: Any
    x: Any
    y: Any
    config: str


@dataclass(frozen=True, slots=True)
class Family:
    """An op family: its builder and the batch sizes it draws from."""

    build: Callable[[random.Random], Body]
    batches: tuple[int, ...] = (1, 2, 3, 4, 5, 7, 8)


class _Layers:
    """``keras.layers``, imported on first use: the draw (keras_families.py's parent process) needs no Keras."""

    def __getattr__(self, name: str) -> Any:
        import keras

        return getattr(keras.layers, name)


L: Any = _Layers()


def _act(rng: random.Random) -> str:
    return rng.choice(_ACTS)


def _out_len(size: int, k: int, s: int, d: int, padding: str) -> int:
    """Output length of a convolution or pooling window (Keras's rule: "same" and "causal" keep ceil(size/s))."""
    return -(-size // s) if padding in ("same", "causal") else (size - d * (k - 1) - 1) // s + 1


def _window(rng: random.Random, size: int, *, dilate: bool = True, causal: bool = False) -> tuple[int, int, int, str]:
    """A drawn kernel, stride, dilation and padding whose output on ``size`` is not empty."""
    k, s = rng.choice([1, 2, 3, 3, 5]), rng.choice([1, 1, 2, 3])
    d = rng.choice([1, 1, 2, 3]) if dilate and s == 1 else 1  # Keras refuses stride > 1 with dilation > 1
    padding = rng.choice(["same", "valid"] + (["causal"] if causal else []))
    while d * (k - 1) + 1 > size:
        k, d = max(1, k - 2), max(1, d - 1)
    return k, s, d, padding


def _channels_first(rng: random.Random) -> bool:
    return rng.random() < 0.2


def _spatial(feed: tuple[int, ...], channels_first: bool) -> tuple[int, ...]:
    return feed[1:] if channels_first else feed[:-1]


def _shape(sizes: Sequence[int], c: int, channels_first: bool) -> tuple[int, ...]:
    return (c, *sizes) if channels_first else (*sizes, c)


def _fmt(channels_first: bool) -> str:
    return "channels_first" if channels_first else "channels_last"


# --- dense, dropout ----------------------------------------------------------------------------------------

def mlp(rng: random.Random) -> Body:
    seq = rng.random() < 0.25  # Dense on the last axis of a (T, D) input
    shape = (rng.randint(2, 16), rng.randint(3, 99)) if seq else (rng.randint(3, 257),)
    layers, parts = [], []
    for _ in range(rng.randint(1, 4)):
        width, act, bias = rng.randint(3, 301), _act(rng), rng.random() < 0.8
        layers.append(L.Dense(width, activation=act, use_bias=bias))
        parts.append(f"{width} {act}{'' if bias else ' nobias'}")
    return Body((Feed(shape),), f"in={shape} dense[{', '.join(parts)}]", tuple(layers))


def dropout(rng: random.Random) -> Body:
    shape = (rng.randint(3, 201),)
    layers, parts = [], []
    for _ in range(rng.randint(1, 3)):
        width, act, rate = rng.randint(3, 257), _act(rng), rng.choice([0.1, 0.25, 0.5, 0.7])
        layers += [L.Dense(width, activation=act), L.Dropout(rate)]
        parts.append(f"{width} {act} drop{rate}")
    return Body((Feed(shape),), f"in={shape} dense+dropout[{', '.join(parts)}]", tuple(layers))


# --- convolution -------------------------------------------------------------------------------------------

def _conv_cls(dim: int) -> Any:
    return getattr(L, f"Conv{dim}D")


_SIZES = {1: (12, 96), 2: (6, 24), 3: (4, 10)}
_WIDTH = {1: 48, 2: 32, 3: 12}


def _conv(dim: int) -> Callable[[random.Random], Body]:
    def build(rng: random.Random) -> Body:
        cf = _channels_first(rng)
        sizes = [rng.randint(*_SIZES[dim]) for _ in range(dim)]
        c = rng.choice([1, 2, 3, 4, 6, 8])
        feed = _shape(sizes, c, cf)
        layers, parts = [], []
        for _ in range(rng.randint(1, 3)):
            k, s, d, padding = _window(rng, min(sizes), causal=dim == 1)
            groups = rng.choice([g for g in (1, 1, 1, 2, 3, 4, c) if c % g == 0])
            filters = groups * rng.randint(1, max(1, _WIDTH[dim] // groups))
            act, bias = _act(rng), rng.random() < 0.8
            layers.append(_conv_cls(dim)(filters, k, strides=s, dilation_rate=d, padding=padding, groups=groups,
                                     activation=act, use_bias=bias, data_format=_fmt(cf)))
            parts.append(f"{filters}k{k}s{s}d{d}g{groups}{padding[0]} {act}{'' if bias else ' nobias'}")
            sizes, c = [_out_len(n, k, s, d, padding) for n in sizes], filters
        return Body((Feed(feed),), f"in={feed} {_fmt(cf)} conv{dim}d[{', '.join(parts)}]", tuple(layers))

    return build


def separable(rng: random.Random) -> Body:
    dim, cf = rng.choice([1, 2]), _channels_first(rng)
    sizes = [rng.randint(*_SIZES[dim]) for _ in range(dim)]
    c = rng.choice([1, 2, 3, 4, 8])
    feed = _shape(sizes, c, cf)
    cls = L.SeparableConv1D if dim == 1 else L.SeparableConv2D
    layers, parts = [], []
    for _ in range(rng.randint(1, 2)):
        k, s, d, padding = _window(rng, min(sizes))
        mult, filters, act = rng.choice([1, 1, 2, 3]), rng.randint(1, _WIDTH[dim]), _act(rng)
        layers.append(cls(filters, k, strides=s, dilation_rate=d, padding=padding, depth_multiplier=mult,
                          activation=act, data_format=_fmt(cf)))
        parts.append(f"{filters}k{k}s{s}d{d}m{mult}{padding[0]} {act}")
        sizes, c = [_out_len(n, k, s, d, padding) for n in sizes], filters
    return Body((Feed(feed),), f"in={feed} {_fmt(cf)} separable{dim}d[{', '.join(parts)}]", tuple(layers))


def depthwise(rng: random.Random) -> Body:
    dim, cf = rng.choice([1, 2]), _channels_first(rng)
    sizes = [rng.randint(*_SIZES[dim]) for _ in range(dim)]
    c = rng.choice([1, 2, 3, 4, 8, 16])
    feed = _shape(sizes, c, cf)
    cls = L.DepthwiseConv1D if dim == 1 else L.DepthwiseConv2D
    layers, parts = [], []
    for _ in range(rng.randint(1, 2)):
        k, s, d, padding = _window(rng, min(sizes))
        mult, act, bias = rng.choice([1, 1, 2, 3]), _act(rng), rng.random() < 0.8
        layers.append(cls(k, strides=s, dilation_rate=d, padding=padding, depth_multiplier=mult, activation=act,
                          use_bias=bias, data_format=_fmt(cf)))
        parts.append(f"k{k}s{s}d{d}m{mult}{padding[0]} {act}{'' if bias else ' nobias'}")
        sizes, c = [_out_len(n, k, s, d, padding) for n in sizes], c * mult
    return Body((Feed(feed),), f"in={feed} {_fmt(cf)} depthwise{dim}d[{', '.join(parts)}]", tuple(layers))


def conv_transpose(rng: random.Random) -> Body:
    dim, cf = rng.choice([1, 2]), _channels_first(rng)
    sizes = [rng.randint(3, 16 if dim == 1 else 8) for _ in range(dim)]
    c = rng.choice([1, 2, 3, 4, 8])
    feed = _shape(sizes, c, cf)
    cls = L.Conv1DTranspose if dim == 1 else L.Conv2DTranspose
    layers, parts = [], []
    for _ in range(rng.randint(1, 2)):
        k, s, d, padding = _window(rng, min(sizes))
        filters, act, bias = rng.randint(1, 12), _act(rng), rng.random() < 0.8
        layers.append(cls(filters, k, strides=s, dilation_rate=d, padding=padding, activation=act, use_bias=bias,
                          data_format=_fmt(cf)))
        parts.append(f"{filters}k{k}s{s}d{d}{padding[0]} {act}{'' if bias else ' nobias'}")
        sizes = [n * s if padding == "same" else n * s + max(k - s, 0) + (d - 1) * (k - 1) for n in sizes]
    return Body((Feed(feed),), f"in={feed} {_fmt(cf)} conv{dim}d_transpose[{', '.join(parts)}]", tuple(layers))


# --- pooling, upsampling -----------------------------------------------------------------------------------

def _global_pool(kind: str, dim: int) -> Any:
    """``GlobalMaxPooling1D`` / ``2D`` or ``GlobalAveragePooling1D`` / ``2D``, looked up when used."""
    return getattr(L, f"Global{'Max' if kind == 'max' else 'Average'}Pooling{dim}D")


def pooling(rng: random.Random) -> Body:
    dim, cf = rng.choice([1, 2]), _channels_first(rng)
    sizes = [rng.randint(*_SIZES[dim]) for _ in range(dim)]
    c, filters = rng.choice([1, 2, 3, 4]), rng.randint(2, 24)
    feed = _shape(sizes, c, cf)
    layers: list[Any] = [_conv_cls(dim)(filters, 3, padding="same", activation="relu", data_format=_fmt(cf))]
    parts = [f"conv{filters}"]
    for _ in range(rng.randint(1, 2)):
        kind, pool = rng.choice(["max", "average"]), rng.choice([2, 2, 3])
        strides, padding = rng.choice([None, 1, 2, 3]), rng.choice(["same", "valid"])
        if padding == "valid" and min(sizes) < pool:
            padding = "same"
        cls = {("max", 1): L.MaxPooling1D, ("max", 2): L.MaxPooling2D,
               ("average", 1): L.AveragePooling1D, ("average", 2): L.AveragePooling2D}[kind, dim]
        layers.append(cls(pool, strides=strides, padding=padding, data_format=_fmt(cf)))
        parts.append(f"{kind}{pool}s{strides or pool}{padding[0]}")
        sizes = [_out_len(n, pool, strides or pool, 1, padding) for n in sizes]
    end = rng.choice(["none", "global_max", "global_average"])
    if end != "none":
        layers.append(_global_pool(end.removeprefix("global_"), dim)(data_format=_fmt(cf)))
        parts.append(end)
    return Body((Feed(feed),), f"in={feed} {_fmt(cf)} pool{dim}d[{', '.join(parts)}]", tuple(layers))


def global_pooling(rng: random.Random) -> Body:
    dim, cf = rng.choice([1, 2]), _channels_first(rng)
    sizes = [rng.randint(*_SIZES[dim]) for _ in range(dim)]
    c, filters = rng.choice([1, 2, 3, 4]), rng.randint(2, 32)
    feed = _shape(sizes, c, cf)
    kind, keep = rng.choice(["max", "average"]), rng.random() < 0.3
    cls = _global_pool(kind, dim)
    layers = (_conv_cls(dim)(filters, 3, padding="same", activation=_act(rng), data_format=_fmt(cf)),
              cls(data_format=_fmt(cf), keepdims=keep))
    return Body((Feed(feed),), f"in={feed} {_fmt(cf)} conv{filters} global_{kind}{dim}d{' keepdims' if keep else ''}",
                layers)


def upsampling(rng: random.Random) -> Body:
    dim = rng.choice([1, 2])
    cf = dim == 2 and _channels_first(rng)  # UpSampling1D takes channels_last only
    sizes = [rng.randint(4, 48 if dim == 1 else 12) for _ in range(dim)]
    c, filters = rng.choice([1, 2, 3, 4]), rng.randint(2, 16)
    feed = _shape(sizes, c, cf)
    layers: list[Any] = [_conv_cls(dim)(filters, 3, padding="same", activation=_act(rng), data_format=_fmt(cf))]
    if dim == 1:
        size: Any = rng.choice([2, 3, 4])
        up, text = L.UpSampling1D(size), f"up1d x{size}"
    else:
        size, interp = (rng.choice([1, 2, 3]), rng.choice([2, 3])), rng.choice(["nearest", "bilinear"])
        up, text = L.UpSampling2D(size, data_format=_fmt(cf), interpolation=interp), f"up2d x{size} {interp}"
    layers.append(up)
    after = rng.random() < 0.5
    if after:
        layers.append(_conv_cls(dim)(rng.randint(1, 8), 3, padding="same", data_format=_fmt(cf)))
    return Body((Feed(feed),), f"in={feed} {_fmt(cf)} conv{filters} {text}{' conv' if after else ''}", tuple(layers))


# --- recurrent, attention, embedding -----------------------------------------------------------------------

_CELLS = {"simple_rnn": "SimpleRNN", "lstm": "LSTM", "gru": "GRU"}


def rnn(rng: random.Random) -> Body:
    kind = rng.choice(sorted(_CELLS))
    shape = (rng.randint(2, 40), rng.randint(2, 24))
    layers, parts = [], []
    depth = rng.choice([1, 1, 2])
    for i in range(depth):
        units, bidirectional = rng.randint(3, 64), rng.random() < 0.35
        back = not bidirectional and rng.random() < 0.4  # Bidirectional runs its own copy backwards
        seq = i < depth - 1 or rng.random() < 0.5
        layer = getattr(L, _CELLS[kind])(units, return_sequences=seq, go_backwards=back, dropout=0.0)
        text = f"{units}{' seq' if seq else ''}{' back' if back else ''}"
        if bidirectional:
            merge = rng.choice(["concat", "sum", "ave", "mul"])
            layer, text = L.Bidirectional(layer, merge_mode=merge), f"bi-{merge} {text}"
        layers.append(layer)
        parts.append(text)
    return Body((Feed(shape),), f"in={shape} {kind}[{', '.join(parts)}]", tuple(layers))


def attention(rng: random.Random) -> Body:
    cross, causal = rng.random() < 0.4, rng.random() < 0.4
    tq, dim = rng.randint(2, 24), rng.randint(4, 48)
    tk, dk = (rng.randint(2, 24), rng.randint(4, 48)) if cross else (tq, dim)
    heads, key_dim = rng.randint(1, 4), rng.randint(4, 24)
    value_dim = rng.choice([None, rng.randint(4, 24)])
    residual = not cross and rng.random() < 0.5
    mha = L.MultiHeadAttention(heads, key_dim, value_dim=value_dim)

    def graph(inputs: list[Any]) -> Any:
        q = inputs[0]
        kv = inputs[1] if cross else q
        out = mha(q, kv, use_causal_mask=causal)
        return L.LayerNormalization()(L.Add()([q, out])) if residual else out

    feeds = (Feed((tq, dim)), Feed((tk, dk))) if cross else (Feed((tq, dim)),)
    config = (f"q={(tq, dim)}{f' kv={(tk, dk)} cross' if cross else ' self'} heads={heads} key_dim={key_dim} "
              f"value_dim={value_dim}{' causal' if causal else ''}{' +residual+layernorm' if residual else ''}")
    return Body(feeds, config, graph=graph)


def embedding(rng: random.Random) -> Body:
    vocab, dim, length = rng.randint(5, 3000), rng.randint(2, 64), rng.randint(1, 48)
    end = rng.choice(["none", "global_average", "global_max", "flatten"])
    layers: list[Any] = [L.Embedding(vocab, dim)]
    layers += {"none": [], "global_average": [L.GlobalAveragePooling1D()], "global_max": [L.GlobalMaxPooling1D()],
               "flatten": [L.Flatten()]}[end]
    dense = rng.random() < 0.5
    if dense:
        layers.append(L.Dense(rng.randint(3, 64), activation=_act(rng)))
    return Body((Feed((length,), vocab),), f"tokens={length} vocab={vocab} dim={dim} {end}{' dense' if dense else ''}",
                tuple(layers))


# --- normalization -----------------------------------------------------------------------------------------

def _norm_layer(rng: random.Random, channels: int, channels_first: bool) -> tuple[Any, str]:
    kind = rng.choice(["batch", "layer", "group"])
    axis = 1 if channels_first else -1
    if kind == "batch":
        center, scale = rng.random() < 0.8, rng.random() < 0.8
        return (L.BatchNormalization(axis=axis, momentum=rng.choice([0.9, 0.99]), center=center, scale=scale),
                f"batchnorm{'' if center else ' nocenter'}{'' if scale else ' noscale'}")
    if kind == "layer":  # on the last axis: Keras's torch backend cannot normalize axis 1 of a 4-D input
        rms = rng.random() < 0.25
        return L.LayerNormalization(axis=-1, rms_scaling=rms), f"layernorm{' rms' if rms else ''}"
    groups = rng.choice([g for g in (1, 2, 3, 4, channels) if channels % g == 0])
    return L.GroupNormalization(groups, axis=axis), f"groupnorm{groups}"


def norm(rng: random.Random) -> Body:
    conv = rng.random() < 0.5
    cf = conv and _channels_first(rng)
    sizes = [rng.randint(4, 16), rng.randint(4, 16)] if conv else []
    c = rng.randint(2, 16) if conv else rng.randint(3, 128)
    feed = _shape(sizes, c, cf)
    layers, parts = [], []
    for _ in range(rng.randint(1, 3)):
        width = rng.choice([2, 3, 4, 6, 8, 12, 16, 24]) if conv else rng.randint(3, 200)
        layers.append(L.Conv2D(width, 3, padding="same", data_format=_fmt(cf)) if conv else L.Dense(width))
        layer, text = _norm_layer(rng, width, cf)
        act = _act(rng)
        layers += [layer, L.Activation(act)]
        parts.append(f"{'conv' if conv else 'dense'}{width} {text} {act}")
    return Body((Feed(feed),), f"in={feed}{' ' + _fmt(cf) if conv else ''} [{', '.join(parts)}]", tuple(layers))


FAMILIES: dict[str, Family] = {
    "mlp": Family(mlp),
    "dropout": Family(dropout),
    "conv1d": Family(_conv(1)),
    "conv2d": Family(_conv(2)),
    "conv3d": Family(_conv(3)),
    "separable": Family(separable),
    "depthwise": Family(depthwise),
    "conv_transpose": Family(conv_transpose),
    "pooling": Family(pooling),
    "global_pooling": Family(global_pooling),
    "upsampling": Family(upsampling),
    "rnn": Family(rnn),
    "attention": Family(attention),
    "embedding": Family(embedding),
    "norm": Family(norm),
}


# --- head, compile, data -----------------------------------------------------------------------------------

def _head(rng: random.Random, shape: tuple[int, ...], loss: str) -> tuple[list[Any], tuple[int, ...], str]:
    """The head's layers for features of ``shape`` (without the batch), the output shape and a description."""
    classes = rng.randint(2, 12)
    # else Dense on the last axis (a per-position output); a large feature map is not flattened (parameters)
    flatten = rng.random() < 0.5 and len(shape) > 1 and int(np.prod(shape)) <= _FLATTEN_MAX
    # Keras's torch backend fails the backward of a sparse cross-entropy over (B, H, W, C): fold H and W first
    fold = not flatten and len(shape) > 2 and loss.startswith("sparse")
    layers = [L.Flatten()] if flatten else [L.Reshape((-1, shape[-1]))] if fold else []
    layers.append(L.Dense(classes, activation=LOSSES[loss][0]))
    out = (classes,) if flatten else (int(np.prod(shape[:-1])), classes) if fold else (*shape[:-1], classes)
    return layers, out, f"{'flatten ' if flatten else 'fold ' if fold else ''}dense{classes}"


def _target(gen: np.random.Generator, loss: str, batch: int, out: tuple[int, ...]) -> Any:
    if loss == "sparse_categorical_crossentropy":
        return gen.integers(0, out[-1], (batch, *out[:-1])).astype("int32")
    if loss == "categorical_crossentropy":
        return np.eye(out[-1], dtype="float32")[gen.integers(0, out[-1], (batch, *out[:-1]))]
    if loss == "binary_crossentropy":
        return gen.integers(0, 2, (batch, *out)).astype("float32")
    return gen.standard_normal((batch, *out)).astype("float32")


def _inputs(gen: np.random.Generator, feeds: Sequence[Feed], batch: int) -> Any:
    arrays = [gen.integers(0, f.high, (batch, *f.shape)).astype("int32") if f.high
              else gen.standard_normal((batch, *f.shape)).astype("float32") for f in feeds]
    return arrays[0] if len(arrays) == 1 else arrays


def assemble(family: str, seed: int, batch: int, optimizer: str, loss: str) -> Built:
    """The compiled model of one case (``seed`` draws the body, the head, the weights and the data)."""
    import keras

    rng = random.Random(seed)
    keras.utils.set_random_seed(seed)
    body = FAMILIES[family].build(rng)
    ins = [keras.Input(f.shape, dtype="int32" if f.high else "float32") for f in body.feeds]
    if body.graph is None:
        model = keras.Sequential([ins[0], *body.layers])
        features = tuple(int(d) for d in model.output_shape[1:])
        head, out, text = _head(rng, features, loss)
        for layer in head:
            model.add(layer)
    else:
        features_tensor = body.graph(ins)
        head, out, text = _head(rng, tuple(int(d) for d in features_tensor.shape[1:]), loss)
        for layer in head:
            features_tensor = layer(features_tensor)
        model = keras.Model(ins, features_tensor)
    model.compile(optimizer=optimizer, loss=loss)
    gen = np.random.default_rng(seed)
    x, y = _inputs(gen, body.feeds, batch), _target(gen, loss, batch, out)
    kind = "functional" if body.graph is not None else "sequential"
    return Built(model, x, y, f"{body.config} | {text} | {kind} params={model.count_params():,}")
