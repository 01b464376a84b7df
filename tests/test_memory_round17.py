"""Round 17 (memory model, notebook 07): counts against first principles and real torch models, sizes given as
numpy numbers, depths below the buffered layers, and measurements of what the setup asks for."""
import json
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch

from sazo_lite.course import memory
from sazo_lite.course.memory import LADDERS, ModelShape, TrainSetup


# -- parameter counts -----------------------------------------------------------------------------------------
def test_gated_ffn_with_biases_counts_its_gate_up_and_down_biases():
    """Llama with attention_bias and mlp_bias: a gated FFN's biases (2F + D per layer) were left out."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, attention_bias=True,
                                      mlp_bias=True, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    shape = ModelShape("llama-bias", 2, 64, 4, 2, 96, 300, bias=True)
    assert shape.param_count() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("kind", [np.int32, np.int64, np.uint16])
def test_numpy_sizes_are_stored_as_python_ints(kind):
    """np.int32 sizes wrapped around: a 16384-wide model with V = 128256 had a negative parameter count."""
    sizes = dict(layers=40, hidden=16384, heads=128, kv_heads=8, ffn=53248, vocab=128256)
    if kind is np.uint16:
        sizes.update(hidden=4096, heads=32, ffn=14336, vocab=32000)
    plain = ModelShape("x", **sizes)
    numpy = ModelShape("x", **{k: kind(v) for k, v in sizes.items()}, norm_params=kind(1))
    assert numpy.param_count() == plain.param_count() > 0
    assert all(type(getattr(numpy, k)) is int for k in (*sizes, "norm_params"))


def test_numpy_context_and_batch_keep_the_mask_and_the_tokens():
    """np.int32(65536)² is 0 in int32: the materialised causal mask vanished and B·N wrapped."""
    shape = LADDERS["llama"][0]
    plain = TrainSetup(context=65536, batch=4, attention="materialised")
    numpy = TrainSetup(context=np.int32(65536), batch=np.int32(4), attention=np.str_("materialised"),
                       dtype=np.str_("float32"), trainable_fraction=np.float32(0.5), zo_buffered_layers=np.int8(2))
    for peak in (memory.bp_memory, memory.zo_memory):
        assert peak(shape, replace(numpy, dtype="bfloat16", trainable_fraction=1.0, zo_buffered_layers=1)) \
            == peak(shape, plain)
    assert numpy.tokens == 65536 * 4 and type(numpy.context) is int and type(numpy.dtype) is str
    assert type(numpy.trainable_fraction) is float and type(numpy.zo_buffered_layers) is int
    json.dumps(dict(shape=asdict(ModelShape("t", np.int64(2), 64, 4, 2, 96, 50)), setup=asdict(numpy)))


# -- ZO buffering L' layers --------------------------------------------------------------------------------------
def test_zo_buffers_at_most_as_many_layers_as_the_model_has():
    """zo_buffered_layers = 36 counted 36 working sets in a 2-layer model (notebook 07's exercise 5: L' = L)."""
    shape, setup = LADDERS["qwen2.5"][2].with_layers(2), TrainSetup(context=4096, batch=2)
    two = memory.zo_memory(shape, replace(setup, zo_buffered_layers=2))
    assert memory.zo_memory(shape, replace(setup, zo_buffered_layers=36)) == two
    assert two.activations > memory.zo_memory(shape, setup).activations


@pytest.mark.parametrize("budget_gb", [6.0, 15.0, 40.0, 100.0])
def test_zo_depth_solved_for_a_budget_is_the_depth_that_fits(budget_gb):
    """With L' = 8 the solver extrapolated from 1 and 2 layers that both held 8 working sets."""
    shape, setup = LADDERS["qwen2.5"][2], TrainSetup(context=8192, batch=2, zo_buffered_layers=8)
    depth = memory._max_layers(shape, setup, budget_gb * memory.GB, "zo")
    fits = [layers for layers in range(1, 1500)
            if memory.zo_memory(shape.with_layers(layers), setup).total <= budget_gb * memory.GB]
    assert (max(fits) if fits else 0) == int(depth) if depth >= 1 else not fits
    ratio = memory.size_ratio(shape, setup, budget_gb)
    bp_depth = memory._max_layers(shape, setup, budget_gb * memory.GB, "bp")
    if bp_depth >= 0 and depth >= 0:
        expected = ((depth * shape.layer_params() + shape.embedding_params())
                    / (bp_depth * shape.layer_params() + shape.embedding_params()))
        assert ratio == pytest.approx(expected)


def test_unbounded_size_ratio_is_the_cost_of_a_layer_beyond_the_buffered_ones():
    shape, setup = LADDERS["llama"][0], TrainSetup(context=2048, zo_buffered_layers=4)
    assert memory.size_ratio(shape, setup) == pytest.approx(memory.size_ratio(shape, replace(setup, zo_buffered_layers=1)))
    assert memory.size_ratio(shape, setup, 1e7) == pytest.approx(memory.size_ratio(shape, setup), rel=0.01)


# -- measurements: what the child runs is what the model predicts ----------------------------------------------
MEASURED = TrainSetup(context=512, batch=4, dtype="float32", chunked_loss=False)


@pytest.mark.parametrize("mode,change", [
    ("inference", dict(chunked_loss=True)), ("zo", dict(chunked_loss=True)), ("bp", dict(chunked_loss=True)),
    ("bp", dict(optimizer="adam")), ("bp", dict(trainable_fraction=0.01)), ("bp", dict(checkpointing=True)),
    ("zo", dict(zo_buffered_layers=2))])
def test_measure_refuses_a_setup_its_child_does_not_run(mode, change, monkeypatch):
    """These were ignored: the child measured full logits, SGD, every parameter, no checkpointing, L' = 1, and
    ``compare`` set that beside the prediction for the setup asked (TrainSetup's default chunked_loss=True
    predicted no logits)."""
    from sazo_lite.course import memory_measure

    def no_child(*args, **kwargs):
        raise AssertionError("a child was started")
    monkeypatch.setattr(memory_measure, "run_child", no_child)
    with pytest.raises(ValueError, match=f"Invalid setup.{next(iter(change))}"):
        memory_measure.compare(memory_measure.TINY, replace(MEASURED, **change), mode)


def test_measure_accepts_settings_its_mode_does_not_read(monkeypatch):
    from sazo_lite.course import memory_measure
    specs = []
    monkeypatch.setattr(memory_measure, "run_child", lambda module, args, **kw: specs.append(args) or {"rss_extra": 1})
    memory_measure.measure(memory_measure.TINY, replace(MEASURED, optimizer="adam", checkpointing=True), "zo")
    memory_measure.measure(memory_measure.TINY, replace(MEASURED, zo_buffered_layers=3), "bp")
    assert len(specs) == 2


@pytest.mark.parametrize("device,reply,key", [("cpu:0", {"rss_extra": 3e6}, "rss_extra"),
                                              ("cuda:0", {"rss_extra": 9e6, "cuda_extra": 2e6}, "cuda_extra")])
def test_compare_reads_the_peak_the_child_reported(device, reply, key, monkeypatch):
    """device='cpu:0' read 'cuda_extra' (KeyError): the key was chosen by device != 'cpu'."""
    from sazo_lite.course import memory_measure
    monkeypatch.setattr(memory_measure, "measure", lambda *args, **kwargs: dict(reply, path="bp"))
    row = memory_measure.compare(memory_measure.TINY, MEASURED, "bp", device)
    assert row["measured"] == reply[key]


@pytest.mark.slow
def test_measure_runs_the_setups_dtype():
    """The child built a float32 decoder whatever the setup's dtype: a bfloat16 point measured float32's bytes
    against a prediction of half of them (+112% for inference at N = 512)."""
    from sazo_lite.course.memory_measure import TINY, measure
    peaks = {dtype: measure(TINY, replace(MEASURED, dtype=dtype), "inference")["rss_extra"]
             for dtype in ("float32", "bfloat16")}
    assert peaks["bfloat16"] < 0.85 * peaks["float32"]


# -- memory_probe ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,name", [(dict(batch=True), "batch"), (dict(batch=0), "batch"),
                                         (dict(batch=2.0), "batch"), (dict(model=None), "model"),
                                         (dict(task=3), "task")])
def test_probe_refuses_bad_arguments_before_a_child_starts(kwargs, name, monkeypatch):
    """batch=True went to the child as JSON true and measured B = 1 (range(True))."""
    from sazo_lite.course import memory_probe
    monkeypatch.setattr(memory_probe, "run_child", lambda *a, **k: {"peak_rss": 1, "extra": 1, "baseline": 0})
    with pytest.raises(ValueError, match=f"Invalid {name}"):
        memory_probe.measure_step("zo", **kwargs)


def test_probe_sends_numpy_batch_as_an_int(monkeypatch):
    from sazo_lite.course import memory_probe
    specs = []
    monkeypatch.setattr(memory_probe, "run_child", lambda module, args, **k: specs.append(json.loads(args[0])) or {})
    memory_probe.measure_step(np.str_("bp"), batch=np.int64(4), model=np.str_("tiny-llama"))
    assert specs == [dict(mode="bp", model="tiny-llama", batch=4, task="sentiment")]


def test_predicted_extra_names_a_bad_mode():
    from sazo_lite.course.memory_measure import TINY, predicted_extra
    with pytest.raises(ValueError, match="Invalid mode"):   # was KeyError: 'backprop'
        predicted_extra(TINY, MEASURED, "backprop")


def test_validate_checks_every_point_before_the_first_child(monkeypatch):
    """A bad last point was found after every point before it had been measured (a child each)."""
    from sazo_lite.course import memory_measure
    started = []
    monkeypatch.setattr(memory_measure, "run_child", lambda *a, **k: started.append(a) or {"rss_extra": 1})
    for bad in [(MEASURED, "backprop"), (replace(MEASURED, chunked_loss=True), "zo")]:
        with pytest.raises(ValueError, match="Invalid"):
            memory_measure.validate([(MEASURED, "zo"), (MEASURED, "bp"), bad], progress=False)
    assert started == []


@pytest.mark.parametrize("platform,unit", [("darwin", 1), ("freebsd14", 1024)])
def test_peak_rss_without_proc_reads_ru_maxrss_in_its_units(platform, unit, monkeypatch):
    """macOS reports ru_maxrss in bytes: the fallback multiplied it by 1024 (a 1 GB peak read as 1 TB)."""
    import builtins
    import resource
    import sys
    from types import SimpleNamespace
    from sazo_lite.course import memory_measure

    real_open = builtins.open

    def no_proc(path, *args, **kwargs):
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", no_proc)
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setattr(resource, "getrusage", lambda who: SimpleNamespace(ru_maxrss=123456))
    assert memory_measure.peak_rss_bytes() == 123456 * unit


# -- the calculator's readout ---------------------------------------------------------------------------------
def test_calculator_reads_small_peaks_in_significant_digits():
    """A 1-layer, 64-wide custom model read 'BP needs 0.0 GB, ZO needs 0.1 GB' (39 MB and 58 MB)."""
    import re
    from sazo_lite.course.widgets import memory_dashboard
    board = memory_dashboard()
    board.controls["preset"].value = "Qwen2.5-0.5B"
    for key, value in dict(layers=1, hidden=64, heads=1, kv_heads=1, ffn=128, context=128, batch=1).items():
        board.controls[key].value = value
    bars = board.figures["bars"]
    totals = [sum(trace.y[i] for trace in bars.data) for i in (0, 1)]
    read = [float(x) for x in re.findall(r"needs <b>([\d.e-]+) GB", board.readout.value)]
    assert len(read) == 2 and all(x > 0 for x in read)
    for shown, total in zip(read, totals):
        assert shown == pytest.approx(total, rel=0.05)
    board.controls["preset"].value = "Qwen2.5-3B"
    board.controls["context"].value, board.controls["batch"].value = 512, 2
    assert "BP needs <b>16.9 GB</b>, ZO needs <b>7.5 GB</b>" in board.readout.value   # notebook 07's answer


# -- the measured decoder is the shape it is given -------------------------------------------------------------
@pytest.mark.parametrize("switches", [dict(gated=False), dict(bias=True), dict(qkv_bias=True),
                                      dict(tied_embeddings=True), dict(norm_params=2), dict(norm_params=0),
                                      dict(gated=False, bias=True, tied_embeddings=True, norm_params=2)])
def test_measured_decoder_builds_the_shapes_switches(switches):
    """build_decoder ignored gated, bias, qkv_bias, tied_embeddings and norm_params: measure() ran a SwiGLU, bias-free,
    untied RMSNorm decoder and set it beside the prediction for the shape asked."""
    from sazo_lite.course.memory_measure import build_decoder
    shape = ModelShape("t", 2, 64, 4, 2, 96, 50, **switches)
    assert sum(p.numel() for p in build_decoder(shape).parameters()) == shape.param_count()


@pytest.mark.parametrize("attention", ["fused", "materialised"])
def test_plain_ffn_decoder_saves_what_the_model_counts(attention):
    from sazo_lite.course.memory_measure import build_decoder, saved_activation_bytes
    shape, n, batch = ModelShape("g", 1, 64, 4, 4, 256, 50, gated=False), 96, 2
    block = build_decoder(shape, attention).blocks[0]
    saved = saved_activation_bytes(block, torch.randn(batch, n, shape.hidden, requires_grad=True))
    setup = TrainSetup(context=n, batch=batch, dtype="float32", attention=attention)
    predicted = memory.activation_elements_per_token(shape, setup) * n * batch * 4
    assert saved == pytest.approx(predicted + (n * n if attention == "materialised" else 0), rel=0.01)


def test_measured_decoder_refuses_an_attention_it_does_not_know():
    from sazo_lite.course.memory_measure import build_decoder
    with pytest.raises(ValueError, match="Invalid attention"):   # "materialized" built the materialised path
        build_decoder(ModelShape("t", 1, 64, 4, 2, 96, 50), "materialized")
    with pytest.raises(ValueError, match="Invalid shape.norm_params"):
        build_decoder(ModelShape("t", 1, 64, 4, 2, 96, 50, norm_params=3))


def test_measured_decoder_keeps_one_causal_mask_for_all_layers():
    """Each layer built and kept its own N×N mask (L·N² bytes saved for backward) where the model counts one."""
    from sazo_lite.course.memory_measure import build_decoder, per_example_loss, saved_activation_bytes
    shape, n, batch = ModelShape("t", 3, 64, 4, 2, 160, 50), 96, 2
    tokens = torch.randint(shape.vocab, (batch, n + 1))
    saved, predicted = {}, {}
    for attention in ("fused", "materialised"):
        model = build_decoder(shape, attention)
        loss = torch.nn.Module()
        loss.forward = lambda t, model=model: per_example_loss(model, t)
        loss.parameters = model.parameters
        saved[attention] = saved_activation_bytes(loss, tokens)
        setup = TrainSetup(context=n, batch=batch, dtype="float32", attention=attention, chunked_loss=False)
        predicted[attention] = memory._stored_activation_bytes(shape, setup)
    # the head and the token ids are the same under both attentions: the difference is attention's alone
    assert saved["materialised"] - saved["fused"] == predicted["materialised"] - predicted["fused"]


# -- the headline table --------------------------------------------------------------------------------------------
def test_headline_rows_say_what_they_compute_for_any_given_setup():
    """headline_table(setup=... checkpointing=True) filled the 'no checkpointing' rows with checkpointed figures."""
    plain = memory.headline_table()
    ckpt = memory.headline_table(setup=replace(memory.HEADLINE_SETUP, checkpointing=True))
    assert [row["ours"] for row in ckpt] == [row["ours"] for row in plain]
    assert "no checkpointing" in ckpt[0]["label"] and ckpt[0]["memory_ratio"] == pytest.approx(
        memory.memory_ratio(memory.HEADLINE_SHAPE, replace(memory.HEADLINE_SETUP, context=512)))


def test_ladder_table_bp_column_is_without_checkpointing():
    """ladder_table(setup with checkpointing=True) printed the checkpointed peak under 'BP' too."""
    setup = TrainSetup(context=2048, batch=2)
    assert memory.ladder_table(setup=replace(setup, checkpointing=True)) == memory.ladder_table(setup=setup)


def test_calculator_says_when_zo_fits_nothing_and_bp_does():
    """Llama-3.2-3B at 2 GB: BP fits its embeddings (0.65 layers), ZO not (its float32 z of V×D is twice the bf16
    grads BP adds there); the readout said 'ZO trains a smaller model of this width than BP (0.0× ...)'."""
    from sazo_lite.course.widgets import memory_dashboard
    board = memory_dashboard()
    board.controls["preset"].value = "Llama-3.2-3B"
    board.controls["budget"].value = 2.0
    shape, setup = LADDERS["llama"][1], TrainSetup(context=512, batch=2)
    assert memory.size_ratio(shape, setup, 2.0) == 0.0
    assert "ZO cannot train any model of this width" in board.readout.value
    assert "smaller model" not in board.readout.value
