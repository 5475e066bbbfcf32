"""Exact rewrites of a frozen bert4keras GraphDef that cut per-call work (private to ``nlp.runtime``).

``SessionRuntime`` freezes the loaded graph (weights become constants, Dense bias-adds move before
their reshapes) and then applies these rewrites before it imports the graph into its session. Each
rewrite turns a pattern that bert4keras writes into one that computes the same values with fewer
passes over memory, or into the form grappler's remapper fuses into one oneDNN kernel:

- ``flatten_dense_inputs``: the shape a Dense on a 3-D input flattens it to (``tf.tensordot``'s
  ``[prod(free dims), prod(contracted dims)]``, six shape ops per call) as the constant
  ``[-1, prod(contracted dims)]`` where those dims are static;
- ``mask_without_broadcasts``: ``SelectV2`` over two ``BroadcastTo`` copies (Keras' ``where``) reads
  the small mask and the scalar fill directly (``SelectV2`` broadcasts by itself);
- ``mask_pointer_scores_once``: the pointer heads' ``-inf`` masking happens on ``(rows, 1, L, L)``
  before the per-predicate bias terms are added, instead of on ``(rows, predicates, L, L)``;
- ``fuse_sibling_dense``: Dense layers over the same input (attention's Q, K and V) as one matmul
  over their concatenated weights, split back;
- ``rewrite_layer_norms``: bert4keras' LayerNormalization as one oneDNN ``_MklLayerNorm`` op;
- ``rewrite_erf_gelus``: the erf GELU after a Dense moved before the Dense's output reshape and
  written as grappler's ``MatMul + BiasAdd + GeluExact`` pattern (``_FusedMatMul``);
- ``fuse_quantized_gelus`` (int8 graphs from ``spo quantize``): the same GELU after a quantized
  Dense as a post-op of the Dense's oneDNN int8 kernel (``_QuantizedMatMul``);
- ``chain_quantized_dense`` (int8): that kernel writes u8 in the next int8 Dense's input range
  instead of floats the next Dense quantizes again (the FFN's two Dense layers).

Every function edits the GraphDef in place, returns how many places it rewrote, leaves a graph it does
not recognise untouched, and keeps every existing node name that something outside the rewritten
pattern reads (fetched outputs keep their names). Only protobuf messages are handled here: this module
does not import TensorFlow (``nlp.runtime`` stays the one module that does).
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Iterable
from typing import Any

import numpy as np

DT_FLOAT = 1
DT_QINT8 = 11
DT_QUINT8 = 12


class _Graph:
    """Name and consumer indexes over a GraphDef, plus helpers to add nodes."""

    def __init__(self, graph_def: Any) -> None:
        self.graph_def = graph_def
        self.nodes: dict[str, Any] = {n.name: n for n in graph_def.node}
        self.consumers: dict[str, list[Any]] = {}
        for n in graph_def.node:
            for name in n.input:
                self.consumers.setdefault(_node_name(name), []).append(n)

    def input(self, node: Any, index: int) -> Any:
        """The node feeding ``node``'s input ``index`` (output 0 only), or None."""
        if index >= len(node.input) or node.input[index].startswith("^"):
            return None
        name = node.input[index]
        if ":" in name and not name.endswith(":0"):
            return None
        return self.nodes.get(_node_name(name))

    def skip_identities(self, node: Any) -> Any:
        while node is not None and node.op == "Identity":
            node = self.input(node, 0)
        return node

    def used_only_by(self, node: Any, users: Iterable[Any]) -> bool:
        allowed = {id(u) for u in users}
        return all(id(c) in allowed for c in self.consumers.get(node.name, []))

    def unique(self, name: str) -> str:
        candidate, i = name, 1
        while candidate in self.nodes:
            candidate, i = f"{name}_{i}", i + 1
        return candidate

    def add(self, like: Any, name: str, op: str, inputs: list[str]) -> Any:
        """A new node with ``like``'s device and dtype attribute ``T``."""
        node = self.graph_def.node.add()
        node.name = self.unique(name)
        node.op = op
        node.input.extend(inputs)
        node.device = like.device
        node.attr["T"].CopyFrom(like.attr["T"])
        self.nodes[node.name] = node
        for i in inputs:
            self.consumers.setdefault(_node_name(i), []).append(node)
        return node

    def add_scalar(self, like: Any, name: str, value: float) -> Any:
        node = self.graph_def.node.add()
        node.name = self.unique(name)
        node.op = "Const"
        node.device = like.device
        node.attr["dtype"].type = DT_FLOAT
        tensor = node.attr["value"].tensor
        tensor.dtype = DT_FLOAT
        tensor.tensor_shape.SetInParent()
        tensor.float_val.append(value)
        self.nodes[node.name] = node
        return node


def _become_identity(node: Any, input_name: str) -> None:
    """Turn ``node`` into ``Identity(input_name)``, keeping its name and dtype (its consumers and
    any fetch of it are untouched)."""
    dtype = type(node.attr["T"])()
    dtype.CopyFrom(node.attr["T"])
    node.op = "Identity"
    node.ClearField("attr")
    node.attr["T"].CopyFrom(dtype)
    del node.input[:]
    node.input.append(input_name)


def _node_name(name: str) -> str:
    return name.lstrip("^").split(":")[0]


def _float_scalar(node: Any) -> float | None:
    """The value of a float32 scalar ``Const`` (or ``HostConst``) node, or None."""
    if node is None or node.op not in ("Const", "HostConst") or node.attr["dtype"].type != DT_FLOAT:
        return None
    tensor = node.attr["value"].tensor
    if tensor.tensor_shape.dim:
        return None
    if tensor.float_val:
        return float(tensor.float_val[0])
    if len(tensor.tensor_content) == 4:
        return float(struct.unpack("<f", tensor.tensor_content)[0])
    if not tensor.tensor_content:
        return 0.0  # a tensor proto with no values holds zeros (how TensorFlow writes 0.0)
    return None


def _int_scalar_or_single(node: Any) -> int | None:
    """The value of an int32/int64 ``Const`` holding one element (scalar or shape [1]), or None."""
    values = _const_ints(node)
    return values[0] if values is not None and len(values) == 1 else None


def _is_float_op(node: Any) -> bool:
    return bool(node.attr["T"].type == DT_FLOAT)


def _pair(graph: _Graph, node: Any, op: str) -> tuple[Any, Any] | None:
    """For a binary ``node``, (input of type ``op``, the other input), in either order."""
    a, b = graph.input(node, 0), graph.input(node, 1)
    if a is not None and a.op == op:
        return a, b
    if b is not None and b.op == op:
        return b, a
    return None


def _const_pair(graph: _Graph, node: Any) -> tuple[float, Any] | None:
    """For a binary ``node`` with one float scalar constant input: (its value, the other input)."""
    for i in (0, 1):
        value = _float_scalar(graph.skip_identities(graph.input(node, i)))
        if value is not None:
            return value, graph.input(node, 1 - i)
    return None


def prune(graph_def: Any, keep: Iterable[str]) -> int:
    """Drop every node that neither ``keep`` (the fetched outputs) nor a placeholder depends on;
    returns how many. Exact: such nodes cannot change a fetched value (TensorFlow never runs them
    for these fetches). Run between rewrites so that a node a rewrite bypassed no longer counts as
    a consumer of its inputs."""
    nodes = {n.name: n for n in graph_def.node}
    live: set[str] = set()
    stack = [_node_name(k) for k in keep] + [
        n.name for n in graph_def.node if n.op == "Placeholder"
    ]
    while stack:
        name = stack.pop()
        if name in live or name not in nodes:
            continue
        live.add(name)
        stack.extend(_node_name(i) for i in nodes[name].input)
    dead = [i for i, n in enumerate(graph_def.node) if n.name not in live]
    for i in reversed(dead):
        del graph_def.node[i]
    return len(dead)


# -- shape arithmetic -------------------------------------------------------------------------


def _const_ints(node: Any) -> list[int] | None:
    """The values of a small int32/int64 ``Const`` (scalar or 1-D), or None."""
    if (
        node is None
        or node.op not in ("Const", "HostConst")
        or node.attr["dtype"].type not in (3, 9)
    ):
        return None
    tensor = node.attr["value"].tensor
    dims = [d.size for d in tensor.tensor_shape.dim]
    if len(dims) > 1:
        return None
    count = dims[0] if dims else 1
    values = list(tensor.int_val or tensor.int64_val)
    if not values and tensor.tensor_content:
        fmt = f"<{count}{'i' if tensor.dtype == 3 else 'q'}"
        values = list(struct.unpack(fmt, tensor.tensor_content))
    if not values:
        values = [0] * count
    if len(values) < count:  # a proto may store a repeated last value once
        values += [values[-1]] * (count - len(values))
    return values if len(values) == count else None


def flatten_dense_inputs(graph_def: Any, dims: dict[str, list[int | None] | None]) -> int:
    """``Reshape(t, Pack(Prod(Gather(Shape(x), free)), Prod(Gather(Shape(x), contracted))))`` ->
    ``Reshape(t, [-1, K])`` with ``K`` the product of ``x``'s static contracted dims.

    This is how ``tf.tensordot`` (a Keras Dense on a 3-D input) flattens its input to a matrix; the
    shape is recomputed on every call by six small ops. Exact: both shapes have ``K`` columns and
    the same element count, so ``-1`` is the same number of rows. Only where every contracted dim of
    ``x`` is static (``dims``: output shapes by node name) and non-zero. The free dims' gather stays
    (the Dense's output reshape reads it); the other ops are pruned afterwards.
    """
    graph = _Graph(graph_def)
    count = 0
    for reshape in list(graph_def.node):
        if reshape.op != "Reshape":
            continue
        pack = graph.input(reshape, 1)
        if pack is None or pack.op != "Pack" or len(pack.input) != 2:
            continue
        prods = [graph.input(pack, i) for i in (0, 1)]
        if any(p is None or p.op != "Prod" for p in prods):
            continue
        gathers = [graph.input(p, 0) for p in prods]
        if any(g is None or g.op != "GatherV2" for g in gathers):
            continue
        shapes = [graph.input(g, 0) for g in gathers]
        if any(s is None or s.op != "Shape" for s in shapes) or shapes[0] is not shapes[1]:
            continue
        x = graph.input(shapes[0], 0)
        x_dims = dims.get(x.name) if x is not None else None
        contracted = _const_ints(graph.skip_identities(graph.input(gathers[1], 1)))
        if x_dims is None or contracted is None:
            continue
        if _const_ints(graph.skip_identities(graph.input(gathers[1], 2))) != [0]:
            continue
        sizes = [x_dims[a] if -len(x_dims) <= a < len(x_dims) else None for a in contracted]
        if not sizes or any(d is None or d <= 0 for d in sizes):
            continue
        columns = math.prod(d for d in sizes if d is not None)
        shape = graph.graph_def.node.add()
        shape.name = graph.unique(f"{reshape.name}/flat_shape")
        shape.op = "Const"
        shape.device = pack.device
        shape.attr["dtype"].type = pack.attr["T"].type
        tensor = shape.attr["value"].tensor
        tensor.dtype = pack.attr["T"].type
        tensor.tensor_shape.dim.add().size = 2
        if tensor.dtype == 3:
            tensor.int_val.extend([-1, columns])
        else:
            tensor.int64_val.extend([-1, columns])
        graph.nodes[shape.name] = shape
        reshape.input[1] = shape.name
        count += 1
    return count


# -- masking ------------------------------------------------------------------------------------


def _shape_leaves(graph: _Graph, node: Any) -> list[Any] | None:
    """The operands of a tree of ``BroadcastArgs`` (``Shape`` nodes or constant shapes)."""
    if node is None:
        return None
    if node.op != "BroadcastArgs":
        return [node]
    leaves = []
    for i in (0, 1):
        sub = _shape_leaves(graph, graph.input(node, i))
        if sub is None:
            return None
        leaves += sub
    return leaves


def _is_shape_of(graph: _Graph, leaf: Any, tensor: Any) -> bool:
    """Whether ``leaf`` is ``Shape(tensor)``, or the constant (empty) shape of a scalar constant."""
    if leaf.op == "Shape":
        return graph.input(leaf, 0) is tensor
    if leaf.op == "Const" and tensor is not None and tensor.op == "Const":
        shape = leaf.attr["value"].tensor
        scalar = not tensor.attr["value"].tensor.tensor_shape.dim
        return scalar and [d.size for d in shape.tensor_shape.dim] == [0]
    return False


def mask_without_broadcasts(graph_def: Any) -> int:
    """``SelectV2(BroadcastTo(c, s), x, BroadcastTo(v, s))`` -> ``SelectV2(c, x, v)``.

    Exact: ``s`` must be ``BroadcastArgs`` of exactly the shapes of ``c``, ``x`` and ``v`` (checked on
    the graph), which is the shape ``SelectV2`` broadcasts its operands to by itself; the values
    selected are the same. The two ``BroadcastTo`` copies (a bool and a float tensor the size of the
    output, per attention layer and pointer head) are no longer made.
    """
    graph = _Graph(graph_def)
    count = 0
    for node in list(graph_def.node):
        if node.op != "SelectV2":
            continue
        cond_b, x, fill_b = (graph.input(node, i) for i in range(3))
        if cond_b is None or fill_b is None or x is None:
            continue
        if cond_b.op != "BroadcastTo" or fill_b.op != "BroadcastTo":
            continue
        if cond_b.input[1] != fill_b.input[1]:
            continue
        cond, fill = graph.input(cond_b, 0), graph.input(fill_b, 0)
        leaves = _shape_leaves(graph, graph.input(cond_b, 1))
        if cond is None or fill is None or leaves is None or len(leaves) != 3:
            continue
        wanted = [cond, x, fill]
        matched = all(any(_is_shape_of(graph, leaf, t) for leaf in leaves) for t in wanted)
        if not matched or not all(
            any(_is_shape_of(graph, leaf, t) for t in wanted) for leaf in leaves
        ):
            continue
        node.input[0] = cond_b.input[0]
        node.input[2] = fill_b.input[0]
        count += 1
    return count


def mask_pointer_scores_once(graph_def: Any) -> int:
    """``SelectV2(c, (a + b1) + b2, -inf)`` -> ``(SelectV2(c, a, -inf) + b1) + b2``.

    The EfficientGlobalPointer heads score ``logits[:, None] + bias1 + bias2`` on ``(rows, heads, L,
    L)`` and then mask with a ``(rows, 1, L, L)`` condition; the mask now goes on the ``(rows, 1, L,
    L)`` logits first, so one pass over the large tensor is saved per head. Exact whenever the bias
    terms are finite: unmasked positions compute the same additions in the same order, masked ones
    give ``-inf + b1 + b2 = -inf``, and broadcasting gives the same shape. (The bias terms are Dense
    outputs; a non-finite one means the model itself overflowed.) Applied only to a ``SelectV2``
    whose fill is a ``-inf`` constant and whose additions have no other consumer.
    """
    graph = _Graph(graph_def)
    count = 0
    for node in list(graph_def.node):
        if node.op != "SelectV2" or not _is_float_op(node):
            continue
        fill = graph.skip_identities(graph.input(node, 2))
        value = _float_scalar(fill)
        if value is None or not (math.isinf(value) and value < 0):
            continue
        outer = graph.input(node, 1)
        if outer is None or outer.op != "AddV2" or not graph.used_only_by(outer, [node]):
            continue
        inner = graph.input(outer, 0)
        if inner is None or inner.op != "AddV2" or not graph.used_only_by(inner, [outer]):
            continue
        base = inner.input[0]
        select = graph.add(
            node, f"{inner.name}/masked", "SelectV2", [node.input[0], base, node.input[2]]
        )
        inner.input[0] = select.name
        # The old SelectV2 becomes an Identity of the outer addition: its name still holds the
        # output that is fetched.
        _become_identity(node, outer.name)
        count += 1
    return count


# -- LayerNorm ----------------------------------------------------------------------------------


def rewrite_layer_norms(graph_def: Any, ranks: dict[str, int | None]) -> int:
    """bert4keras LayerNormalization -> one ``_MklLayerNorm`` (oneDNN's layer norm) per layer.

    bert4keras computes ``divide_no_nan(x - mean, sqrt(max(var + eps, 0))) * gamma + beta`` with
    ``mean`` and ``var = mean((x - mean)^2)`` over the last axis, in eight ops and as many passes.
    ``_MklLayerNorm(x, gamma, beta, epsilon=eps)`` is the same formula in one pass. Exact: ``eps``
    is checked to be a positive constant, so ``var + eps > 0`` and neither the ``max(., 0)`` nor the
    no-NaN division changes a value; the two differ only in floating-point rounding. The node is
    written directly rather than left to grappler's remapper, whose layer-norm patterns do not match
    bert4keras' graph and, for the one that could be produced, drop ``eps`` for oneDNN's default
    0.001 (measured: 2e-4 relative error). The caller applies this only where oneDNN's kernel
    exists; ``ranks`` gives each node's output rank (the kernel takes 2-D and 3-D inputs).
    """
    graph = _Graph(graph_def)
    count = 0
    for out in list(graph_def.node):
        if out.op != "AddV2" or not _is_float_op(out):
            continue
        found = _pair(graph, out, "Mul")
        if found is None:
            continue
        mul, beta = found
        pair = _pair(graph, mul, "DivNoNan")
        if pair is None or beta is None:
            continue
        div, gamma = pair
        sub, sqrt = graph.input(div, 0), graph.input(div, 1)
        if gamma is None or sub is None or sub.op != "Sub" or sqrt is None or sqrt.op != "Sqrt":
            continue
        add_eps = graph.input(sqrt, 0)
        if add_eps is not None and add_eps.op == "Maximum":
            zero = _const_pair(graph, add_eps)
            if zero is None or zero[0] != 0.0:
                continue
            add_eps = zero[1]
        if add_eps is None or add_eps.op not in ("AddV2", "Add"):
            continue
        eps_pair = _const_pair(graph, add_eps)
        if eps_pair is None or not eps_pair[0] > 0.0:
            continue
        eps, var = eps_pair
        if var is None or var.op != "Mean" or not var.attr["keep_dims"].b:
            continue
        square = graph.input(var, 0)
        if square is None or square.op != "Square" or graph.input(square, 0) is not sub:
            continue
        x, mean = graph.input(sub, 0), graph.input(sub, 1)
        if x is None or mean is None or mean.op != "Mean" or graph.input(mean, 0) is not x:
            continue
        if not mean.attr["keep_dims"].b or ranks.get(x.name) not in (2, 3):
            continue
        axes = [_int_scalar_or_single(graph.input(m, 1)) for m in (mean, var)]
        rank = ranks[x.name]
        if rank is None or any(a not in (-1, rank - 1) for a in axes):
            continue
        if sub.input[0] != mean.input[0] or _one_d(graph.skip_identities(gamma)) is None:
            continue
        if _one_d(graph.skip_identities(beta)) is None:
            continue
        gamma_input = mul.input[1] if graph.input(mul, 0) is div else mul.input[0]
        beta_input = out.input[1] if graph.input(out, 0) is mul else out.input[0]
        norm = graph.add(
            out, f"{out.name}/layer_norm", "_MklLayerNorm", [sub.input[0], gamma_input, beta_input]
        )
        norm.attr["epsilon"].f = eps
        _become_identity(out, norm.name)
        count += 1
    return count


def _one_d(node: Any) -> int | None:
    """The length of a 1-D constant, or None."""
    if node is None or node.op != "Const":
        return None
    dims = node.attr["value"].tensor.tensor_shape.dim
    return dims[0].size if len(dims) == 1 else None


# -- GELU ---------------------------------------------------------------------------------------


def _gelu_input(graph: _Graph, out: Any) -> tuple[Any, list[Any]] | None:
    """If ``out`` ends bert4keras' ``0.5 * x * (1 + erf(x / sqrt(2)))``: (x, the pattern's nodes)."""
    if out.op != "Mul" or not _is_float_op(out):
        return None
    found = _pair(graph, out, "AddV2")
    if found is None:
        return None
    add, half_x = found
    one = _const_pair(graph, add)
    if one is None or one[0] != 1.0 or one[1] is None or one[1].op != "Erf":
        return None
    erf = one[1]
    scaled = graph.input(erf, 0)
    if scaled is None:
        return None
    if scaled.op == "RealDiv":
        root2 = _float_scalar(graph.skip_identities(graph.input(scaled, 1)))
        x = graph.input(scaled, 0)
        if root2 is None or abs(root2 - math.sqrt(2.0)) > 1e-6:
            return None
    elif scaled.op == "Mul":
        pair = _const_pair(graph, scaled)
        if pair is None or abs(pair[0] - math.sqrt(0.5)) > 1e-6:
            return None
        x = pair[1]
    else:
        return None
    if half_x is None or half_x.op != "Mul":
        return None
    half = _const_pair(graph, half_x)
    if half is None or half[0] != 0.5 or half[1] is not x:
        return None
    return x, [out, add, erf, scaled, half_x]


def _gelu_on_reshape(graph: _Graph, out: Any) -> Any:
    """If ``out`` ends an erf GELU (``_gelu_input``) of a ``Reshape``, maybe through Identities,
    and nothing outside the GELU reads the Reshape or its Identities: that Reshape, else None."""
    found = _gelu_input(graph, out)
    if found is None:
        return None
    x, pattern = found
    chain = []
    node = x
    while node is not None and node.op == "Identity":
        chain.append(node)
        node = graph.input(node, 0)
    if node is None or node.op != "Reshape":
        return None
    users = pattern + chain
    if not graph.used_only_by(node, users) or not all(graph.used_only_by(n, users) for n in chain):
        return None
    if not graph.used_only_by(x, pattern):
        return None
    if not all(graph.used_only_by(n, pattern) for n in pattern[1:]):
        return None
    return node


def _reshaped_into(graph: _Graph, out: Any, reshape: Any, value: str) -> None:
    """Make ``out`` an Identity of ``value`` reshaped as ``reshape`` reshapes (same shape input):
    the GELU rewrites' last step, once the GELU has moved before the reshape."""
    new_reshape = graph.add(
        reshape, f"{out.name}/gelu/reshape", "Reshape", [value, reshape.input[1]]
    )
    new_reshape.attr["Tshape"].CopyFrom(reshape.attr["Tshape"])
    _become_identity(out, new_reshape.name)


def rewrite_erf_gelus(graph_def: Any) -> int:
    """The erf GELU after a Dense -> applied before the Dense's output reshape, in the remapper's
    ``MatMul + BiasAdd + GeluExact`` form (``_FusedMatMul``, one oneDNN kernel).

    Matches ``gelu(Reshape(BiasAdd(MatMul(a, w), b)))`` where ``gelu`` is bert4keras' ``0.5 * x * (1 +
    erf(x / sqrt(2)))`` (after ``_fold_bias_adds``, a Dense's bias-add sits before its reshape) and
    rewrites it to ``Reshape(y * ((erf(y * sqrt(1/2)) + 1) * 0.5))`` with ``y = BiasAdd(...)``. Exact:
    GELU is elementwise, so it commutes with the reshape; the rest is the same formula with the
    division by sqrt(2) as a multiplication by its inverse and the products in another order
    (floating-point rounding only). The GELU's output node keeps its name (as an Identity).
    """
    graph = _Graph(graph_def)
    count = 0
    for out in list(graph_def.node):
        reshape = _gelu_on_reshape(graph, out)
        if reshape is None:
            continue
        bias_add = graph.input(reshape, 0)
        if bias_add is None or bias_add.op != "BiasAdd":
            continue
        matmul = graph.input(bias_add, 0)
        if matmul is None or matmul.op != "MatMul" or not graph.used_only_by(bias_add, [reshape]):
            continue
        y = bias_add.name
        inv_root2 = graph.add_scalar(out, f"{out.name}/gelu/sqrt_half", math.sqrt(0.5))
        one = graph.add_scalar(out, f"{out.name}/gelu/one", 1.0)
        half = graph.add_scalar(out, f"{out.name}/gelu/half", 0.5)
        scaled = graph.add(out, f"{out.name}/gelu/scaled", "Mul", [y, inv_root2.name])
        erf = graph.add(out, f"{out.name}/gelu/erf", "Erf", [scaled.name])
        plus_one = graph.add(out, f"{out.name}/gelu/plus_one", "AddV2", [erf.name, one.name])
        halved = graph.add(out, f"{out.name}/gelu/halved", "Mul", [plus_one.name, half.name])
        gelu = graph.add(out, f"{out.name}/gelu/output", "Mul", [halved.name, y])
        _reshaped_into(graph, out, reshape, gelu.name)
        count += 1
    return count


# -- int8 (graphs written by ``spo quantize``) ----------------------------------------------------

QUANTIZED_MATMUL = "QuantizedMatMulWithBiasAndDequantize"

# Not rewritten, on purpose: Q, K and V as one int8 matmul. ``spo quantize`` gives Q, K and V one
# input range (their three ``QuantizeV2`` read the same min/max constants) but a weight range each,
# per tensor (scalar ``min_b``/``max_b``, different for Q, K and V on RBT6), so the concatenated
# weight would need per-channel ranges; ``QuantizedMatMulWithBiasAndDequantize`` takes scalars only
# (a vector fails a CHECK and aborts the process, tried), and requantizing the three to one range is
# not exact.


def _quantized_matmul_with_gelu(graph: _Graph, old: Any, name: str) -> Any:
    """A ``_QuantizedMatMul`` computing what ``old`` (a ``QuantizedMatMulWithBiasAndDequantize``)
    does, then the exact (erf) GELU, as oneDNN post-ops ``BiasAdd, GeluExact, Dequantize``.

    Same inputs (quantized activation, int8 weights, int32 bias, the ranges), same scales, same
    int32 bias: without the GELU its outputs were bit-identical to the old op's (RBT6). Only Dense
    layers followed by a GELU are converted: converting every int8 Dense measured no faster, and
    slower at 128 tokens (this kernel runs matmuls that fit in L2 on one thread).
    """
    node = graph.graph_def.node.add()
    node.name = graph.unique(name)
    node.op = "_QuantizedMatMul"
    node.device = old.device
    node.input.extend(old.input[:7])
    t1, t2, tbias = old.attr["T1"].type, old.attr["T2"].type, old.attr["Tbias"].type
    attr = node.attr
    attr["Tdevice_inputs"].list.type.extend([t1, t2, tbias])
    attr["Thost_inputs"].list.type.extend([DT_FLOAT] * 4)
    attr["Tdevice_outputs"].list.type.append(DT_FLOAT)
    attr["Thost_outputs"].list.SetInParent()
    attr["T1"].type, attr["T2"].type, attr["Tbias"].type = t1, t2, tbias
    attr["Tout"].type = DT_FLOAT
    attr["U"].type = DT_FLOAT
    attr["transpose_a"].b = old.attr["transpose_a"].b
    attr["transpose_b"].b = old.attr["transpose_b"].b
    attr["is_weight_const"].b = True
    attr["is_bias_const"].b = True
    attr["fused_ops"].list.s.extend([b"BiasAdd", b"GeluExact", b"Dequantize"])
    attr["input_quant_mode"].s = old.attr["input_quant_mode"].s or b"MIN_FIRST"
    attr["output_quant_mode"].s = b"SCALED"
    graph.nodes[node.name] = node
    return node


def _is_old_quantized_matmul(graph: _Graph, node: Any) -> bool:
    """A ``QuantizedMatMulWithBiasAndDequantize`` (u8 x s8, float output) with constant weights."""
    if node is None or node.op != QUANTIZED_MATMUL or len(node.input) != 9:
        return False
    if node.attr["T1"].type != DT_QUINT8 or node.attr["T2"].type != DT_QINT8:
        return False
    if node.attr["Toutput"].type != DT_FLOAT or node.attr["transpose_a"].b:
        return False
    weight = graph.skip_identities(graph.input(node, 1))
    return weight is not None and weight.op == "Const"


def fuse_quantized_gelus(graph_def: Any) -> int:
    """The erf GELU after an int8 Dense -> a post-op of the Dense's ``_QuantizedMatMul``.

    Matches ``gelu(Reshape(QuantizedMatMulWithBiasAndDequantize(...)))`` (bert4keras' erf GELU, as
    ``rewrite_erf_gelus`` reads it) and rewrites it to ``Reshape(_QuantizedMatMul(...))`` with fused
    ops ``BiasAdd, GeluExact, Dequantize``: oneDNN applies the exact (erf) GELU to the dequantized
    output in the same pass. Exact up to floating-point rounding: GELU is elementwise, so it commutes
    with the reshape. The GELU's output node keeps its name (as an Identity).
    """
    graph = _Graph(graph_def)
    count = 0
    for out in list(graph_def.node):
        reshape = _gelu_on_reshape(graph, out)
        if reshape is None:
            continue
        matmul = graph.input(reshape, 0)
        if not _is_old_quantized_matmul(graph, matmul) or not graph.used_only_by(matmul, [reshape]):
            continue
        fused = _quantized_matmul_with_gelu(graph, matmul, f"{matmul.name}/gelu")
        _reshaped_into(graph, out, reshape, fused.name)
        count += 1
    return count


# -- sibling Dense layers (Q, K and V) ------------------------------------------------------------


def _float_matrix(node: Any) -> np.ndarray[Any, Any] | None:
    """The value of a 1-D or 2-D float32 ``Const`` as a numpy array, or None."""
    if node is None or node.op != "Const" or node.attr["dtype"].type != DT_FLOAT:
        return None
    tensor = node.attr["value"].tensor
    dims = [d.size for d in tensor.tensor_shape.dim]
    if len(dims) not in (1, 2) or any(d <= 0 for d in dims):
        return None
    count = math.prod(dims)
    if tensor.tensor_content:
        values = np.frombuffer(tensor.tensor_content, dtype="<f4")
    else:
        values = np.asarray(tensor.float_val, dtype=np.float32)
        if 0 < len(values) < count:  # a proto may store a repeated last value once
            values = np.concatenate([values, np.full(count - len(values), values[-1], np.float32)])
    if len(values) != count:
        return None
    return values.reshape(dims)


def _set_float_const(node: Any, value: np.ndarray[Any, Any]) -> None:
    node.attr["dtype"].type = DT_FLOAT
    tensor = node.attr["value"].tensor
    tensor.dtype = DT_FLOAT
    for d in value.shape:
        tensor.tensor_shape.dim.add().size = d
    tensor.tensor_content = np.ascontiguousarray(value, dtype="<f4").tobytes()


def _source_key(graph: _Graph, node: Any, depth: int = 0) -> Any:
    """What a node computes, as far as pure shape ops over one tensor go: equal keys, equal values.

    ``Reshape``, ``Transpose``, ``Identity``, ``ConcatV2`` and ``Pack`` are keyed by their op, their
    attributes and their inputs' keys, a ``Const`` by its value; anything else by its name. (Each
    Dense flattens its input itself, so the Q, K and V matmuls read three equal
    ``Reshape(Transpose(x, ConcatV2(constants)), constant)``.)"""
    if node is None:
        return None
    if node.op == "Const":
        return ("Const", node.attr["value"].SerializeToString(deterministic=True))
    if node.op in _PURE_OPS and depth < 8:
        inputs = [graph.input(node, i) for i in range(len(node.input))]
        if any(i is None for i in inputs):
            return node.name
        attrs = tuple(
            (k, node.attr[k].SerializeToString(deterministic=True)) for k in sorted(node.attr)
        )
        return (node.op, attrs, tuple(_source_key(graph, i, depth + 1) for i in inputs))
    return node.name


_PURE_OPS = frozenset({"Reshape", "Transpose", "Identity", "ConcatV2", "Pack"})


def fuse_sibling_dense(graph_def: Any) -> int:
    """Dense layers reading the same input (attention's Q, K and V) -> one ``MatMul + BiasAdd`` over
    their concatenated weights, split back into the old outputs; returns how many groups.

    Matches float ``BiasAdd(MatMul(a_i, W_i), b_i)`` (after ``_fold_bias_adds``) with constant 2-D
    ``W_i`` and 1-D ``b_i`` where every ``a_i`` computes the same value (``_source_key``) and each
    MatMul feeds only its BiasAdd. Writes ``BiasAdd(MatMul(a_1, [W_1 | W_2 | ...]), [b_1 | b_2 |
    ...])`` and a ``SplitV`` along the last axis; each old BiasAdd becomes an Identity of its part.
    Exact: column ``j`` of a matrix product depends only on column ``j`` of the weight, so each
    part is the old product (floating-point rounding aside: oneDNN may block a wider matrix
    differently). The old weights are pruned afterwards, so the model holds its weights once; one
    matmul of ``3N`` columns replaces three of ``N`` (one oneDNN call, one pass over the input).
    """
    graph = _Graph(graph_def)
    groups: dict[Any, list[tuple[Any, Any, Any, Any]]] = {}
    for bias_add in list(graph_def.node):
        if bias_add.op != "BiasAdd" or not _is_float_op(bias_add):
            continue
        if bias_add.attr["data_format"].s not in (b"", b"NHWC"):
            continue
        matmul = graph.input(bias_add, 0)
        if matmul is None or matmul.op != "MatMul" or not _is_float_op(matmul):
            continue
        if matmul.attr["transpose_a"].b or matmul.attr["transpose_b"].b:
            continue
        if not graph.used_only_by(matmul, [bias_add]):
            continue
        weight = _float_matrix(graph.skip_identities(graph.input(matmul, 1)))
        bias = _float_matrix(graph.skip_identities(graph.input(bias_add, 1)))
        if weight is None or bias is None or weight.ndim != 2 or bias.ndim != 1:
            continue
        if bias.shape[0] != weight.shape[1]:
            continue
        key = (_source_key(graph, graph.input(matmul, 0)), weight.shape[0], matmul.device)
        if key[0] is None:
            continue
        groups.setdefault(key, []).append((bias_add, matmul, weight, bias))
    count = 0
    for members in groups.values():
        if len(members) < 2:
            continue
        first_add, first_matmul = members[0][0], members[0][1]
        stem = first_matmul.name.rsplit("/", 2)[0]
        weights = graph.graph_def.node.add()
        weights.name = graph.unique(f"{stem}/fused_dense/kernel")
        weights.op = "Const"
        weights.device = first_matmul.device
        _set_float_const(weights, np.concatenate([m[2] for m in members], axis=1))
        biases = graph.graph_def.node.add()
        biases.name = graph.unique(f"{stem}/fused_dense/bias")
        biases.op = "Const"
        biases.device = first_add.device
        _set_float_const(biases, np.concatenate([m[3] for m in members]))
        graph.nodes[weights.name], graph.nodes[biases.name] = weights, biases
        matmul = graph.add(
            first_matmul,
            f"{stem}/fused_dense/MatMul",
            "MatMul",
            [first_matmul.input[0], weights.name],
        )
        matmul.attr["transpose_a"].b = False
        matmul.attr["transpose_b"].b = False
        added = graph.add(
            first_add, f"{stem}/fused_dense/BiasAdd", "BiasAdd", [matmul.name, biases.name]
        )
        added.attr["data_format"].s = b"NHWC"
        sizes = graph.graph_def.node.add()
        sizes.name = graph.unique(f"{stem}/fused_dense/sizes")
        sizes.op = "Const"
        sizes.attr["dtype"].type = 3
        sizes.attr["value"].tensor.dtype = 3
        sizes.attr["value"].tensor.tensor_shape.dim.add().size = len(members)
        sizes.attr["value"].tensor.int_val.extend(int(m[2].shape[1]) for m in members)
        axis = graph.graph_def.node.add()
        axis.name = graph.unique(f"{stem}/fused_dense/axis")
        axis.op = "Const"
        axis.attr["dtype"].type = 3
        axis.attr["value"].tensor.dtype = 3
        axis.attr["value"].tensor.tensor_shape.SetInParent()
        axis.attr["value"].tensor.int_val.append(-1)
        graph.nodes[sizes.name], graph.nodes[axis.name] = sizes, axis
        split = graph.add(
            first_add, f"{stem}/fused_dense/split", "SplitV", [added.name, sizes.name, axis.name]
        )
        split.attr["Tlen"].type = 3
        split.attr["num_split"].i = len(members)
        for i, (bias_add, _, _, _) in enumerate(members):
            _become_identity(bias_add, f"{split.name}:{i}")
        count += 1
    return count


# -- int8 from one Dense to the next (no dequantize/quantize round trip) --------------------------

QUANTIZE = "QuantizeV2"

# Ops the walk from a ``QuantizeV2`` back to the int8 op that produced its input may cross: each
# moves values without changing them, so it commutes with an elementwise quantization.
_VALUE_PRESERVING = frozenset({"Reshape", "Identity", "Transpose"})

# The activations TensorFlow's ``_QuantizedMatMul`` fuses before ``Requantize``.
_REQUANTIZABLE_ACTIVATIONS = frozenset(
    {b"Relu", b"Relu6", b"Elu", b"GeluApproximate", b"GeluExact", b"Tanh", b"LeakyRelu", b"Sigmoid"}
)


def _const_or_concat_ints(graph: _Graph, node: Any) -> list[int] | None:
    """``_const_ints``, or the values of a ``ConcatV2`` of such constants along axis 0 (how
    ``tf.tensordot`` writes its permutation)."""
    node = graph.skip_identities(node)
    if node is None or node.op != "ConcatV2":
        return _const_ints(node)
    parts = [
        _const_ints(graph.skip_identities(graph.input(node, i))) for i in range(len(node.input))
    ]
    if any(p is None for p in parts) or parts[-1] != [0]:
        return None
    return [v for p in parts[:-1] for v in p or []]


def _is_identity_transpose(graph: _Graph, node: Any) -> bool:
    perm = _const_or_concat_ints(graph, graph.input(node, 1))
    return perm is not None and perm == list(range(len(perm)))


def _quantize_range(graph: _Graph, quantize: Any) -> tuple[str, str] | None:
    """The constant ``(min_range, max_range)`` inputs of a u8 ``MIN_FIRST`` ``QuantizeV2`` whose
    range TensorFlow uses as given, or None.

    ``QuantizeV2`` widens its range to contain 0 and to span at least ``ensure_minimum_range`` (times
    the largest magnitude, at least 1); a range it would widen is left to it (the requantizing
    kernel takes the range as given).
    """
    if quantize.attr["T"].type != DT_QUINT8 or quantize.attr["mode"].s != b"MIN_FIRST":
        return None
    if quantize.attr["narrow_range"].b or (
        "axis" in quantize.attr and quantize.attr["axis"].i != -1
    ):
        return None  # per-channel ranges
    low = _float_scalar(graph.skip_identities(graph.input(quantize, 1)))
    high = _float_scalar(graph.skip_identities(graph.input(quantize, 2)))
    if low is None or high is None:
        return None
    minimum = (
        quantize.attr["ensure_minimum_range"].f if "ensure_minimum_range" in quantize.attr else 0.01
    )
    epsilon = np.float32(max(1.0, abs(low), abs(high))) * np.float32(minimum)
    if not (low <= 0.0 <= high) or np.float32(high) < np.float32(low) + epsilon:
        return None
    return quantize.input[1], quantize.input[2]


def _dequantizing_producer(graph: _Graph, quantize: Any) -> tuple[Any, list[Any]] | None:
    """For a ``QuantizeV2`` whose input is, through value-preserving ops only, the float output of
    a ``_QuantizedMatMul`` ending in ``Dequantize``: (that op, the ops in between from the op's
    side). None unless every op in between feeds only the next one (or a ``Shape``)."""
    chain: list[Any] = []
    node = graph.input(quantize, 0)
    while node is not None and node.op in _VALUE_PRESERVING:
        if node.op == "Transpose" and not _is_identity_transpose(graph, node):
            return None
        chain.append(node)
        node = graph.input(node, 0)
    if node is None or node.op != "_QuantizedMatMul" or node.attr["Tout"].type != DT_FLOAT:
        return None
    fused_ops = list(node.attr["fused_ops"].list.s)
    if fused_ops[:1] != [b"BiasAdd"] or fused_ops[-1:] != [b"Dequantize"] or len(node.input) != 7:
        return None
    if not set(fused_ops[1:-1]) <= _REQUANTIZABLE_ACTIVATIONS or len(fused_ops) > 3:
        return None  # the kernel requantizes after BiasAdd and one activation only
    if (
        len(node.attr["Thost_outputs"].list.type)
        or len(node.attr["Tdevice_outputs"].list.type) != 1
    ):
        return None
    chain.reverse()
    readers = [node, *chain, quantize]
    for before, after in itertools.pairwise(readers):
        users = graph.consumers.get(before.name, [])
        if not all(u is after or u.op == "Shape" for u in users):
            return None
        if any(name != before.name and _node_name(name) == before.name for name in after.input):
            return None  # reads another output of ``before``
    return node, chain


def _requantizing_copy(graph: _Graph, old: Any, low: str, high: str) -> Any:
    """``old`` (a ``_QuantizedMatMul`` ending in ``Dequantize``) ending in ``Requantize`` instead:
    u8 output in ``MIN_FIRST`` mode over ``[low, high]``, and that range as outputs 1 and 2."""
    node = graph.graph_def.node.add()
    node.CopyFrom(old)
    node.name = graph.unique(f"{old.name}/requantize")
    del node.input[7:]
    node.input.extend([low, high])
    attr = node.attr
    attr["Thost_inputs"].list.type.extend([DT_FLOAT] * 2)
    del attr["Tdevice_outputs"].list.type[:]
    attr["Tdevice_outputs"].list.type.append(DT_QUINT8)
    attr["Thost_outputs"].list.type.extend([DT_FLOAT, DT_FLOAT])
    attr["Tout"].type = DT_QUINT8
    attr["fused_ops"].list.s[-1] = b"Requantize"
    attr["output_quant_mode"].s = b"MIN_FIRST"
    graph.nodes[node.name] = node
    for name in node.input:
        graph.consumers.setdefault(_node_name(name), []).append(node)
    return node


def chain_quantized_dense(graph_def: Any) -> int:
    """An int8 Dense whose float output is quantized again for the next int8 Dense -> the first
    writes u8 in the next one's input range, the next reads it; returns how many.

    Matches ``QuantizeV2(Reshape/Identity/identity-Transpose...(_QuantizedMatMul(...)))`` where the
    ``_QuantizedMatMul`` ends in ``Dequantize`` (``BiasAdd[, activation], Dequantize``, as
    ``fuse_quantized_gelus`` writes the FFN's first Dense + GELU) and the ``QuantizeV2`` is u8
    ``MIN_FIRST`` over a constant range (what ``spo quantize`` writes): the op becomes the same
    ``_QuantizedMatMul`` ending in ``Requantize`` into that range (``output_quant_mode``
    ``MIN_FIRST``), reshaped as the float output was, and whatever read the ``QuantizeV2``'s
    three outputs reads the new op's. Exact up to rounding: the kernel writes ``y * 255 / (max -
    min) - min * 255 / (max - min)`` rounded and saturated to u8, ``QuantizeV2`` reaches the same
    u8 value through its own float arithmetic, so a value on a rounding tie may land one step
    away (RBT6 int8 at 8 x 128: 6 of 3.1M in one layer; none at one row); the next op's range and
    bias compensation are unchanged.
    ``Shape`` ops that read the float chain (a Dense's output reshape reads its input's shape)
    read the u8 copy. In a BERT layer only the FFN's second Dense reads an int8 op's output
    through no float maths; every other quantized input comes from a LayerNorm or an Einsum, and
    the pointer heads' second Dense reads a float output that RoPE reads too (left alone: the
    float is needed anyway). Faster at every measured shape on RBT6 (1-7%, BENCHMARKS.md).
    """
    graph = _Graph(graph_def)
    count = 0
    for quantize in list(graph_def.node):
        if quantize.op != QUANTIZE:
            continue
        found = _dequantizing_producer(graph, quantize)
        span = _quantize_range(graph, quantize)
        if found is None or span is None:
            continue
        old, chain = found
        new = _requantizing_copy(graph, old, *span)
        value = new.name
        for link in chain:
            if link.op == "Reshape":
                reshape = graph.add(link, f"{link.name}/u8", "Reshape", [value, link.input[1]])
                reshape.attr["T"].type = DT_QUINT8
                reshape.attr["Tshape"].CopyFrom(link.attr["Tshape"])
                value = reshape.name
            for user in graph.consumers.get(link.name, []):
                if user.op == "Shape":
                    user.input[0] = value
                    user.attr["T"].type = DT_QUINT8
        for old_shape_user in graph.consumers.get(old.name, []):
            if old_shape_user.op == "Shape":
                old_shape_user.input[0] = new.name
                old_shape_user.attr["T"].type = DT_QUINT8
        outputs = {quantize.name: value, f"{quantize.name}:0": value}
        outputs.update({f"{quantize.name}:{i}": f"{new.name}:{i}" for i in (1, 2)})
        for user in graph.consumers.get(quantize.name, []):
            for i, name in enumerate(user.input):
                if name in outputs:
                    user.input[i] = outputs[name]
        count += 1
    return count
