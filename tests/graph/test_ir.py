"""OpGraph: structure, validation errors, JSON round trip, schema."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpualloc.errors import GraphError
from gpualloc.graph.ir import OpEdge, OpGraph, OpNode, parse_graph_document, summarize
from gpualloc.graph.schema import json_schema


def doc(nodes, edges, **extra):
    return {"format": "gpualloc-graph", "version": 1, "name": "t", "nodes": nodes, "edges": edges, **extra}


def test_topology_and_critical_path(diamond_graph):
    g = diamond_graph
    order = [g.nodes[i].id for i in g.topo_order]
    assert order[0] == "a" and order[-1] == "d"
    length, path = g.critical_path()
    assert path == ["a", "b", "d"]
    assert length == pytest.approx(2e9 + 1e6)
    assert g.successors[g.index["a"]] == (g.index["b"], g.index["c"])
    assert g.predecessors[g.index["d"]] == (g.index["b"], g.index["c"])


def test_summary(diamond_graph):
    s = summarize(diamond_graph)
    assert s["nodes"] == 4 and s["edges"] == 4
    assert s["total_flops"] == pytest.approx(2e9 + 2e6)
    assert s["param_bytes"] == 1e6
    assert s["measured_on"] == ["V100-16GB"]
    assert s["flops_per_sample"] == pytest.approx((2e9 + 2e6) / 8)


def test_json_round_trip(tmp_path, diamond_graph):
    path = tmp_path / "g.json"
    diamond_graph.save(path)
    raw = json.loads(path.read_text())
    assert raw["format"] == "gpualloc-graph" and raw["version"] == 1 and raw["batch_size"] == 8
    back = OpGraph.load(path)
    assert back.nodes == diamond_graph.nodes
    assert back.edges == diamond_graph.edges
    assert back.to_dict() == diamond_graph.to_dict()


def test_minimal_document_optional_fields_absent():
    g = parse_graph_document(doc([{"id": "x"}, {"id": "y", "flops": 5}], [{"src": "x", "dst": "y", "bytes": 3}]))
    assert g.node("x").name == "x" and g.node("x").kind == "op"
    assert g.total_flops == 5 and g.edge_bytes.tolist() == [3]


@pytest.mark.parametrize(
    ("nodes", "edges", "message"),
    [
        ([{"id": "a"}, {"id": "b"}], [{"src": "a", "dst": "b"}, {"src": "b", "dst": "a"}], "cycle through node 'a'"),
        ([{"id": "a"}], [{"src": "a", "dst": "zz"}], "unknown node 'zz'"),
        ([{"id": "a"}], [{"src": "a", "dst": "a"}], "self loop"),
        ([{"id": "a"}, {"id": "a"}], [], "duplicate node id 'a'"),
        ([{"id": "a", "param_bytes": -4}], [], "(id 'a').param_bytes"),
        ([{"id": "a"}, {"id": "b"}], [{"src": "a", "dst": "b", "bytes": -1}], "('a' -> 'b').bytes"),
        ([{"id": "a", "time_ms": {"T4": {"fwd": -1}}}], [], "(id 'a').time_ms.T4.fwd"),
        ([{"id": "a", "colour": "red"}], [], "(id 'a').colour"),
        ([{"name": "no id"}], [], "nodes[0].id"),
    ],
)
def test_validation_errors_name_the_culprit(nodes, edges, message):
    with pytest.raises(GraphError) as info:
        parse_graph_document(doc(nodes, edges), "g.json")
    text = str(info.value)
    assert message in text and text.startswith("g.json: ") and "\n" not in text


def test_format_and_version_checked():
    with pytest.raises(GraphError, match="format: expected 'gpualloc-graph'"):
        parse_graph_document({**doc([], []), "format": "onnx"})
    with pytest.raises(GraphError, match="version: this gpualloc reads version 1, got 7"):
        parse_graph_document({**doc([], []), "version": 7})


def test_bad_json_names_file_and_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"format": "gpualloc-graph",\n "version": 1,\n "nodes": [,]}')
    with pytest.raises(GraphError, match=r"bad.json:3: not valid JSON"):
        OpGraph.load(path)
    with pytest.raises(GraphError, match="missing.json: cannot read"):
        OpGraph.load(tmp_path / "missing.json")


def test_direct_construction_validates():
    with pytest.raises(GraphError, match="cycle"):
        OpGraph("c", [OpNode("a", "a", "x"), OpNode("b", "b", "x")], [OpEdge("a", "b", 0), OpEdge("b", "a", 0)])
    with pytest.raises(GraphError, match="flops must be >= 0"):
        OpGraph("n", [OpNode("a", "a", "x", flops=float("nan"))], [])


def test_json_schema_describes_the_format():
    schema = json_schema()
    assert schema["properties"]["format"]["const"] == "gpualloc-graph"
    assert {"nodes", "format", "version"} <= set(schema["required"])
    node = schema["$defs"]["NodeDoc"]["properties"]
    assert {"id", "name", "kind", "flops", "param_bytes", "output_bytes", "time_ms"} <= set(node)


@st.composite
def dags(draw):
    n = draw(st.integers(1, 12))
    nodes = [{"id": f"n{i}", "flops": draw(st.floats(0, 1e12)), "output_bytes": draw(st.integers(0, 10**9))}
             for i in range(n)]
    edges = [{"src": f"n{i}", "dst": f"n{j}", "bytes": draw(st.integers(0, 10**6))}
             for i in range(n) for j in range(i + 1, n) if draw(st.booleans())]
    order = draw(st.permutations(range(n)))
    return doc([nodes[k] for k in order], edges)


@settings(max_examples=60, deadline=None)
@given(dags())
def test_any_dag_round_trips_and_orders_topologically(document):
    g = parse_graph_document(document)
    pos = {g.nodes[i].id: k for k, i in enumerate(g.topo_order)}
    assert all(pos[e.src] < pos[e.dst] for e in g.edges)
    again = parse_graph_document(json.loads(json.dumps(g.to_dict())))
    assert again.to_dict() == g.to_dict()


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                    max_leaves=10))
def test_garbage_documents_raise_only_graph_errors(garbage):
    try:
        parse_graph_document(garbage)
    except GraphError:
        pass


def test_the_loss_reads_the_outputs_no_node_consumes():
    nodes = [OpNode(x, x, "op", output_bytes=b) for x, b in (("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 4.0))]
    # a -> b -> d and a -> c: c and d leave the model
    g = OpGraph("g", nodes, [OpEdge("a", "b", 1.0), OpEdge("b", "d", 2.0), OpEdge("a", "c", 1.0)])
    assert g.loss_input_bytes.tolist() == [0.0, 0.0, 3.0, 4.0]
    # a profiled chain listed without edges: its last node's output
    assert OpGraph("chain", nodes, []).loss_input_bytes.tolist() == [0.0, 0.0, 0.0, 4.0]
