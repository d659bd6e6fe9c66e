"""The "tpu" c10d backend with ranks as threads of this process (one CPU-plugin
device each): every collective against values computed on CPU, subgroups,
DTensor on 1-D and 2-D meshes, and the errors of bad calls; each test through
both transports (XLA collective programs, and host staging through gloo)."""

import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import torch_tpu
from torch_tpu.distributed import run_threads

WORLD = 4


@pytest.fixture(params=["xla", "host"], autouse=True)
def transport(request, monkeypatch):
    monkeypatch.setenv("TORCH_TPU_COLLECTIVES", request.param)
    return request.param


def rank_input(rank, shape=(3, 5), dtype=torch.float32):
    g = torch.Generator().manual_seed(100 + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-50, 50, shape, generator=g).to(dtype)


def all_inputs(**kw):
    return [rank_input(r, **kw) for r in range(WORLD)]


REDUCE = {
    "SUM": lambda xs: torch.stack(xs).sum(0),
    "AVG": lambda xs: torch.stack(xs).sum(0) / len(xs),
    "PRODUCT": lambda xs: torch.stack(xs).prod(0),
    "MIN": lambda xs: torch.stack(xs).amin(0),
    "MAX": lambda xs: torch.stack(xs).amax(0),
    "BAND": lambda xs: xs[0] & xs[1] & xs[2] & xs[3],
    "BOR": lambda xs: xs[0] | xs[1] | xs[2] | xs[3],
    "BXOR": lambda xs: xs[0] ^ xs[1] ^ xs[2] ^ xs[3],
}


@pytest.mark.parametrize(
    "dtype,ops",
    [
        (torch.float32, ["SUM", "AVG", "PRODUCT", "MIN", "MAX"]),
        (torch.bfloat16, ["SUM", "MAX"]),
        (torch.int64, ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]),
    ],
)
def test_all_reduce_every_op(dtype, ops):
    def body(rank):
        out = {}
        for op in ops:
            t = rank_input(rank, dtype=dtype).to("tpu")
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            out[op] = t.cpu()
        return out

    results = run_threads(body)
    xs = all_inputs(dtype=dtype)
    for op in ops:
        expected = REDUCE[op]([x.float() for x in xs]).to(dtype) if dtype == torch.bfloat16 else REDUCE[op](xs)
        for r in range(WORLD):
            tol = {"rtol": 1e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-6, "atol": 1e-6}
            torch.testing.assert_close(results[r][op], expected, **tol, msg=f"{op} rank {r}")


def test_gather_scatter_family_and_point_to_point():
    def body(rank):
        x = rank_input(rank).to("tpu")
        got = {}
        whole = torch.empty(WORLD * 3, 5, device="tpu")
        dist.all_gather_into_tensor(whole, x)
        got["all_gather_into_tensor"] = whole.cpu()
        parts = [torch.empty(3, 5, device="tpu") for _ in range(WORLD)]
        dist.all_gather(parts, x)
        got["all_gather"] = torch.stack([p.cpu() for p in parts])
        b = x.clone()
        dist.broadcast(b, src=2)
        got["broadcast"] = b.cpu()
        r = x.clone()
        dist.reduce(r, dst=1, op=dist.ReduceOp.MAX)
        got["reduce"] = r.cpu()
        big = (torch.cat([rank_input(rank, shape=(2, 5))] * WORLD) * (torch.arange(WORLD * 2) + 1)[:, None]).to("tpu")
        piece = torch.empty(2, 5, device="tpu")
        dist.reduce_scatter_tensor(piece, big.to("tpu"))
        got["reduce_scatter_tensor"] = (piece.cpu(), big.cpu())
        listed = torch.empty(2, 5, device="tpu")
        dist.reduce_scatter(listed, list(big.chunk(WORLD)), op=dist.ReduceOp.AVG)
        got["reduce_scatter"] = listed.cpu()
        gathered = [torch.empty(3, 5, device="tpu") for _ in range(WORLD)] if rank == 3 else None
        dist.gather(x, gathered, dst=3)
        got["gather"] = None if gathered is None else torch.stack([g.cpu() for g in gathered])
        scattered = torch.empty(3, 5, device="tpu")
        dist.scatter(scattered, [x + i for i in range(WORLD)] if rank == 0 else None, src=0)
        got["scatter"] = scattered.cpu()
        a2a = torch.empty(WORLD * 2, 5, device="tpu")
        dist.all_to_all_single(a2a, big)
        got["all_to_all_single"] = a2a.cpu()
        outs = [torch.empty(2, 5, device="tpu") for _ in range(WORLD)]
        dist.all_to_all(outs, list(big.chunk(WORLD)))
        got["all_to_all"] = torch.cat([o.cpu() for o in outs])
        if rank % 2 == 0:
            dist.send(x * 3, dst=rank + 1, tag=7)
        else:
            y = torch.empty(3, 5, device="tpu")
            dist.recv(y, src=rank - 1, tag=7)
            got["recv"] = y.cpu()
        dist.barrier()
        return got

    res = run_threads(body)
    xs = all_inputs()
    bigs = [res[r]["reduce_scatter_tensor"][1] for r in range(WORLD)]
    for r in range(WORLD):
        g = res[r]
        assert torch.equal(g["all_gather_into_tensor"], torch.cat(xs))
        assert torch.equal(g["all_gather"], torch.stack(xs))
        assert torch.equal(g["broadcast"], xs[2])
        assert torch.equal(g["reduce"], torch.stack(xs).amax(0) if r == 1 else xs[r])  # non-roots keep theirs
        torch.testing.assert_close(g["reduce_scatter_tensor"][0], sum(b.chunk(WORLD)[r] for b in bigs))
        torch.testing.assert_close(g["reduce_scatter"], sum(b.chunk(WORLD)[r] for b in bigs) / WORLD)
        assert (g["gather"] is None) == (r != 3)
        assert r != 3 or torch.equal(g["gather"], torch.stack(xs))
        torch.testing.assert_close(g["scatter"], xs[0] + r)
        assert torch.equal(g["all_to_all_single"], torch.cat([b.chunk(WORLD)[r] for b in bigs]))
        assert torch.equal(g["all_to_all"], torch.cat([b.chunk(WORLD)[r] for b in bigs]))
        if r % 2:
            assert torch.equal(g["recv"], xs[r - 1] * 3)


def test_uneven_all_to_all():
    # Rank r sends (r + j) % 3 rows to rank j (some chunks empty); rows are
    # tagged with sender, receiver and position so every element is checked.
    def rows(src, dst):
        n = (src + dst) % 3
        return torch.stack([torch.tensor([src, dst, k, 0.5]) for k in range(n)]) if n else torch.empty(0, 4)

    def body(rank):
        send = torch.cat([rows(rank, j) for j in range(WORLD)]).to("tpu")
        in_splits = [(rank + j) % 3 for j in range(WORLD)]
        out_splits = [(j + rank) % 3 for j in range(WORLD)]
        single = torch.empty(sum(out_splits), 4, device="tpu")
        dist.all_to_all_single(single, send, out_splits, in_splits)
        outs = [torch.empty(out_splits[j], 4, device="tpu", dtype=torch.int64) for j in range(WORLD)]
        dist.all_to_all(outs, [rows(rank, j).long().to("tpu") for j in range(WORLD)])
        return single.cpu(), torch.cat([o.cpu() for o in outs])

    before = torch_tpu.metrics()
    results = run_threads(body)
    after = torch_tpu.metrics()
    moved = after.get("collective_bytes::all_to_all", 0) - before.get("collective_bytes::all_to_all", 0)
    assert moved > 0 and after["collective::all_to_all"] > before.get("collective::all_to_all", 0)
    for r, (single, listed) in enumerate(results):
        expected = torch.cat([rows(j, r) for j in range(WORLD)])
        assert torch.equal(single, expected)
        assert torch.equal(listed, expected.long())


def test_subgroups_and_premul_sum():
    def body(rank):
        odd = dist.new_group([1, 3])
        even = dist.new_group([0, 2])
        t = torch.full((2,), float(rank), device="tpu")
        dist.all_reduce(t, group=odd if rank % 2 else even)
        s = torch.ones(2, device="tpu")
        dist.all_reduce(s, op=dist._make_nccl_premul_sum(0.5))
        return t.cpu(), s.cpu()

    res = run_threads(body)
    assert [r[0].tolist() for r in res] == [[2.0, 2.0], [4.0, 4.0], [2.0, 2.0], [4.0, 4.0]]
    assert all(r[1].tolist() == [2.0, 2.0] for r in res)


def test_dtensor_on_1d_and_2d_meshes():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    a = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
    b = torch.randn(6, 4, generator=torch.Generator().manual_seed(2))

    def body(rank):
        mesh = init_device_mesh("tpu", (WORLD,))
        da = distribute_tensor(a.to("tpu"), mesh, [Shard(0)])
        db = distribute_tensor(b.to("tpu"), mesh, [Replicate()])
        rows = (da @ db).redistribute(mesh, [Replicate()]).to_local().cpu()
        col = distribute_tensor(a.to("tpu"), mesh, [Shard(1)])
        partial = (col @ distribute_tensor(b.to("tpu"), mesh, [Shard(0)])).redistribute(mesh, [Replicate()])
        mesh2 = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
        d2 = distribute_tensor(a.to("tpu"), mesh2, [Shard(0), Shard(1)])
        back = d2.redistribute(mesh2, [Replicate(), Replicate()]).to_local().cpu()
        summed = d2.sum().full_tensor().cpu()
        moved = distribute_tensor(a.to("tpu"), mesh, [Shard(0)]).redistribute(mesh, [Shard(1)])  # 6 columns: uneven
        return rows, partial.to_local().cpu(), back, summed, moved.full_tensor().cpu()

    for rows, partial, back, summed, moved in run_threads(body):
        torch.testing.assert_close(rows, a @ b)
        torch.testing.assert_close(partial, a @ b)
        assert torch.equal(back, a)
        torch.testing.assert_close(summed, a.sum())
        assert torch.equal(moved, a)


def test_fsdp2_matches_one_process_on_the_full_batch():
    import copy

    from torch.distributed.fsdp import fully_shard

    from torch_tpu import demo

    tok = demo.CharTokenizer(demo.load_corpus())
    data = tok.encode(demo.load_corpus())
    base = demo.make_model(tok.vocab_size, 0, dropout=0.0, d_model=32, n_layers=2)  # made once: CPU RNG is shared

    def train(model, rank, world):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        share, losses = 8 // world, []
        for x, y in demo.batches(data, 3, 8, 32, 0):
            _, loss = model(
                x[rank * share : (rank + 1) * share].to("tpu"), y[rank * share : (rank + 1) * share].to("tpu")
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    def body(rank):
        model = copy.deepcopy(base).to("tpu")
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        losses = train(model, rank, WORLD)
        return losses, [p.full_tensor().cpu() for p in model.parameters()]

    ranks = run_threads(body)
    single = copy.deepcopy(base).to("tpu")
    reference = train(single, 0, 1)
    mean = [sum(r[0][i] for r in ranks) / WORLD for i in range(3)]
    torch.testing.assert_close(mean, reference, rtol=1e-5, atol=0)
    for got, want in zip(ranks[0][1], single.parameters(), strict=True):
        torch.testing.assert_close(got, want.detach().cpu(), rtol=1e-5, atol=1e-6)


def compiled_collectives(x, y):
    import torch.distributed._functional_collectives as funcol

    world = dist.group.WORLD
    s = funcol.all_reduce(x * 2, "sum", world)
    m = funcol.all_reduce(x, "max", world)
    g = funcol.all_gather_tensor(s, 0, world)
    r = funcol.reduce_scatter_tensor(g.reshape(-1, 5) * y.sum(), "avg", 0, world)
    a = funcol.all_to_all_single(g, None, None, world)
    b = funcol.broadcast(x, 2, world)
    dist.all_reduce(y)  # in place: Dynamo traces it as a functional collective and a copy
    return s + 1, m, g, r, a, b


def run_compiled_graphs(body):
    """run_threads(body), and what its compiled graphs did: the launches of
    graphs holding collectives, and the warnings of graphs that ran eagerly."""
    before = torch_tpu.metrics().get("collective::compiled_graph", 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ranks = run_threads(body)
    eager = [str(w.message) for w in caught if "runs eagerly" in str(w.message)]
    return ranks, torch_tpu.metrics().get("collective::compiled_graph", 0) - before, eager


def test_compiled_graph_runs_its_collectives_in_its_program(transport):
    def body(rank):
        x, y = rank_input(rank, (4, 5)).to("tpu"), rank_input(rank + 10, (2,)).to("tpu")
        y2 = y.clone()
        got = torch.compile(compiled_collectives, backend="tpu")(x, y)
        want = compiled_collectives(x, y2)
        return [t.cpu() for t in got + (y,)], [t.cpu() for t in want + (y2,)]

    ranks, launched, eager = run_compiled_graphs(body)
    for got, want in ranks:
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    if transport == "xla":  # one program per rank, launched together: no eager fallback
        assert not eager and launched == WORLD
        # metrics say what each program holds: 7 collectives, and the bytes they take in per launch
        held = [c for c in torch_tpu.metrics()["graph_collectives"].values() if c["collectives"] == 7]
        assert held and held[-1]["ops"] == {
            "all_reduce": 3,
            "all_gather_into_tensor": 1,
            "reduce_scatter_tensor": 1,
            "all_to_all_single": 1,
            "broadcast": 1,
        }
        assert held[-1]["bytes"] == 4 * (20 + 20 + 80 + 2 + 20 + 80 + 20), held[-1]
    else:  # processes cannot share a program: the graph runs eagerly, with a warning naming why
        assert launched == 0 and any("host staging" in m for m in eager)


def test_compiled_graphs_that_differ_between_ranks_run_eagerly(transport):
    import torch.distributed._functional_collectives as funcol

    def body(rank):
        @torch.compile(backend="tpu")
        def f(x):  # the rank is a constant of each rank's graph
            return funcol.all_reduce(x * (dist.get_rank() + 1), "sum", dist.group.WORLD) + 1

        return f(torch.ones(3, device="tpu")).cpu()

    expected = "compiled different graphs" if transport == "xla" else "host staging"
    with pytest.warns(UserWarning, match=expected):
        ranks = run_threads(body)
    assert all(out.tolist() == [11.0, 11.0, 11.0] for out in ranks)


def test_mismatched_calls_raise_naming_every_rank():
    def body(rank):
        t = torch.ones(4 if rank != 2 else 5, device="tpu")
        dist.all_reduce(t)

    with pytest.raises(RuntimeError, match=r"made different collective calls(.|\n)*rank 2: all_reduce SUM of f32\[5\]"):
        run_threads(body)


def test_missing_rank_raises_in_bounded_time(transport):
    def body(rank):
        if rank != 1:
            dist.all_reduce(torch.ones(2, device="tpu"))

    # XLA: the others time out naming rank 1. Host: gloo sees rank 1 leave, or times out waiting for it.
    expected = (
        r"for ranks \[1\], which did not call it"
        if transport == "xla"
        else r"through host memory and gloo failed on rank \d: .*(closed|reset|[Tt]imed out)"
    )
    with pytest.raises(RuntimeError, match=expected):
        run_threads(body, timeout=timedelta(seconds=2))


def test_bad_calls_raise_clear_errors():
    def body(rank):
        errors = []
        for call in (
            lambda: dist.all_reduce(torch.ones(2, device="tpu"), op=dist.ReduceOp.BAND),
            lambda: dist.all_gather_into_tensor(torch.empty(5, device="tpu"), torch.ones(2, device="tpu")),
        ):
            try:
                call()
            except RuntimeError as e:
                errors.append(str(e))
        # The process group stays usable after a refused call.
        t = torch.ones(1, device="tpu")
        dist.all_reduce(t)
        return errors, t.item()

    for errors, total in run_threads(body, world_size=2):
        assert "bitwise reductions need an integer or bool tensor" in errors[0]
        assert "all_gather_into_tensor: the output has 5 elements" in errors[1]
        assert total == 2.0


def test_two_ranks_on_one_device(transport):
    def body(rank):
        torch.tpu.set_device(0)
        t = torch.ones(2, device="tpu")
        dist.all_reduce(t)
        return t.cpu()

    if transport == "xla":  # one program cannot run twice on one device
        with pytest.raises(RuntimeError, match="use the same device"):
            run_threads(body, world_size=2)
    else:  # through host memory, devices do not matter
        assert all(torch.equal(t, torch.full((2,), 2.0)) for t in run_threads(body, world_size=2))


def tensor_parallel_block(x, w1, w2, w3, w4):
    """Two MLPs, Megatron style: w1/w3 split by columns (hidden units per rank),
    w2/w4 by rows; their partial sums redistributed inside the function."""
    from torch.distributed.tensor import DTensor, Replicate

    def replicate(t):
        return t.redistribute(t.device_mesh, [Replicate()]) if isinstance(t, DTensor) else t

    x = x + replicate(torch.relu(x @ w1) @ w2)
    x = x + replicate(torch.nn.functional.gelu(x @ w3) @ w4)
    return x.detach(), x.square().sum()


def test_compiled_dtensor_block_is_one_program_per_rank_with_its_collectives(transport):
    """A compiled function of DTensors: DTensor's sharding propagation puts the
    collectives in the graph; each rank's graph (forward, and backward) is one
    program with them inside, equal to the unsharded block. (The graph also
    carries opaque inputs, the mesh and placements, which it hands back.)"""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(0)
    d = 16
    x = torch.randn(2, 3, d, generator=g)
    weights = [torch.randn(d, d, generator=g) / 4 for _ in range(4)]
    placements = [Shard(1), Shard(0), Shard(1), Shard(0)]
    reference = [w.clone().requires_grad_() for w in weights]
    want, loss = tensor_parallel_block(x, *reference)
    loss.backward()

    def body(rank):
        mesh = init_device_mesh("tpu", (WORLD,))
        ws = [
            distribute_tensor(w.to("tpu"), mesh, [p]).detach().requires_grad_()
            for w, p in zip(weights, placements, strict=True)
        ]
        xd = distribute_tensor(x.to("tpu"), mesh, [Replicate()])
        out, loss = torch.compile(tensor_parallel_block, backend="tpu")(xd, *ws)
        loss.backward()
        return out.full_tensor().cpu(), [w.grad.full_tensor().cpu() for w in ws]

    ranks, launched, eager = run_compiled_graphs(body)
    for out, grads in ranks:
        torch.testing.assert_close(out, want.detach(), rtol=1e-5, atol=1e-5)
        for got, w in zip(grads, reference, strict=True):
            torch.testing.assert_close(got, w.grad, rtol=1e-4, atol=1e-5)
    if transport == "xla":  # forward and backward each hold collectives: two launches per rank
        assert not eager and launched == 2 * WORLD, (eager, launched)
    else:
        assert launched == 0 and any("host staging" in m for m in eager)


def test_compiled_ddp_model_trains_as_one_process():
    """torch.compile of a DDP model over thread ranks (DDP's reducer
    all-reduces the gradients between the compiled pieces) equals one process
    on the whole batch. Ranks compiling at once once deadlocked in an import
    (see run_threads)."""
    import copy

    from torch.nn.parallel import DistributedDataParallel

    g = torch.Generator().manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x, y = torch.randn(WORLD, 8, 8, generator=g), torch.randn(WORLD, 8, 4, generator=g)

    def body(rank):
        model = DistributedDataParallel(copy.deepcopy(base).to("tpu"))
        step = torch.compile(model, backend="tpu")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            torch.nn.functional.mse_loss(step(x[rank].to("tpu")), y[rank].to("tpu")).backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().cpu() for p in model.parameters()]

    ranks = run_threads(body)
    single = copy.deepcopy(base)
    opt = torch.optim.SGD(single.parameters(), lr=0.1)
    for _ in range(3):
        (sum(torch.nn.functional.mse_loss(single(x[r]), y[r]) for r in range(WORLD)) / WORLD).backward()
        opt.step()
        opt.zero_grad()
    for params in ranks:
        for got, want in zip(params, single.parameters(), strict=True):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)


def fused_collective_counts():
    m = torch_tpu.metrics()
    return m.get("fused_collective_windows", 0), m.get("fused_collective_replays", 0)


def test_fused_window_holds_its_collectives(transport):
    """Fused mode: collectives join the rank's window (no flush at each), and
    the ranks' windows run as one program over their devices (XLA transport;
    host staging flushes at each, as before)."""

    def body(rank):
        t = rank_input(rank).to("tpu") * 2
        dist.all_reduce(t)
        u = t.sin()
        dist.all_reduce(u, op=dist.ReduceOp.MAX)
        gathered = torch.empty(WORLD * 15, device="tpu")
        dist.all_gather_into_tensor(gathered, (u + rank).reshape(-1))
        return gathered.cpu()

    xs = all_inputs()
    u = (torch.stack(xs).sum(0) * 2).sin()
    want = torch.cat([(u + r).reshape(-1) for r in range(WORLD)])
    windows, replays = fused_collective_counts()
    with torch_tpu.set_eager_mode("fused"):
        ranks = run_threads(body)
    for got in ranks:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    windows, replays = (a - b for a, b in zip(fused_collective_counts(), (windows, replays), strict=True))
    # xla: one window per rank with all three collectives inside, never replayed
    assert (windows, replays) == ((WORLD, 0) if transport == "xla" else (0, 0))


def test_fused_ddp_steps_hold_their_all_reduces_and_survive_ranks_that_read_early(transport):
    """A DDP training step in Fused mode: the reducer's bucket all-reduces are
    recorded into each rank's window, and every step's window runs as one
    program per rank, equal to one process on the whole batch. When one rank
    reads a value mid-step (its window ends early), the ranks' windows differ:
    each is replayed op by op, its collectives meeting one at a time, with the
    same results."""
    import copy

    from torch.nn.parallel import DistributedDataParallel

    g = torch.Generator().manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x, y = torch.randn(WORLD, 8, 8, generator=g), torch.randn(WORLD, 8, 4, generator=g)
    steps = 3

    def train(read_early):
        def body(rank):
            model = DistributedDataParallel(copy.deepcopy(base).to("tpu"))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            losses = []
            for _ in range(steps):
                loss = torch.nn.functional.mse_loss(model(x[rank].to("tpu")), y[rank].to("tpu"))
                loss.backward()
                if read_early and rank == 0:
                    float(model.module[0].weight.grad.sum())
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
            return losses, [p.detach().cpu() for p in model.parameters()]

        before = fused_collective_counts()
        reduces = torch_tpu.metrics().get("collective::all_reduce", 0)
        with torch_tpu.set_eager_mode("fused"):
            ranks = run_threads(body)
        reduces = torch_tpu.metrics().get("collective::all_reduce", 0) - reduces
        return ranks, [a - b for a, b in zip(fused_collective_counts(), before, strict=True)], reduces

    single = copy.deepcopy(base)
    opt = torch.optim.SGD(single.parameters(), lr=0.1)
    want_losses = []
    for _ in range(steps):
        losses = [torch.nn.functional.mse_loss(single(x[r]), y[r]) for r in range(WORLD)]
        (sum(losses) / WORLD).backward()
        opt.step()
        opt.zero_grad()
        want_losses.append([float(v) for v in losses])
    reduces = {}
    for read_early in (False, True):
        ranks, (windows, replays), reduces[read_early] = train(read_early)
        for rank, (losses, params) in enumerate(ranks):
            torch.testing.assert_close(losses, [s[rank] for s in want_losses], rtol=1e-5, atol=1e-6)
            for got, want in zip(params, single.parameters(), strict=True):
                torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
        if transport == "host":
            assert (windows, replays) == (0, 0)
        elif not read_early:  # every step: one window per rank, its all-reduces inside
            assert windows >= steps * WORLD and replays == 0, (windows, replays)
        else:
            assert replays >= steps, (windows, replays)
    # a collective is counted once per call, replayed or not
    assert reduces[True] == reduces[False] > 0, reduces
