"""``python -m topo_attn.doctor``: it runs on a CPU (text and ``--json``), names the interpreter and the missing
GPU, gives a reason for every kernel choice, turns bad values into one line and exit 2, launches nothing, and
its choices are the ones ``scheduled_attention`` makes: checked here in the interpreter on small shapes, and on
a real GPU by the ``cuda`` test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import topo_attn as ta
from helpers import DEVICE, inputs  # in tests/
from topo_attn import cli, doctor
from topo_attn.attention import decode, forward, hopper
from topo_attn.attention.scheduled import decode_kernel_reason

CPU_ENV = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "CUDA_VISIBLE_DEVICES": ""}
"""A process that sees no GPU (and, unless added, no TRITON_INTERPRET)."""


def run_doctor(*args: str, interpret: bool = True) -> subprocess.CompletedProcess:
    env = dict(CPU_ENV, **({"TRITON_INTERPRET": "1"} if interpret else {}))
    return subprocess.run([sys.executable, "-m", "topo_attn.doctor", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def choices(report: dict) -> list[tuple[str, str]]:
    """(which choice, its reason) for every kernel choice of a report."""
    kern = report["kernels"]
    found = [("forward", kern["forward"]["reason"]), ("forward_with_grad", kern["forward_with_grad"]["reason"]),
             ("decode", kern["decode"]["reason"]), ("schedule_builder", kern["schedule_builder"]["reason"]),
             ("gluon_backward", kern["gluon_backward"]["reason"]),
             ("direct_launch", report["triton_state"]["direct_launch_reason"])]
    found += [(f"backward {when}", choice["reason"]) for when, choice in kern["backward"].items()]
    return found


# --- the command on this CPU ---------------------------------------------------------------------------------


def test_text_names_the_interpreter_and_a_reason_for_each_kernel():
    result = run_doctor()
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "no CUDA GPU" in out
    assert "interpreter (TRITON_INTERPRET=1)" in out
    assert "direct launch    off: the Triton interpreter runs" in out
    assert f"torch            {torch.__version__}" in out
    for label in ("forward", "backward", "decode", "schedule build", "advice"):
        assert f"\n  {label}" in out or f"\n{label}" in out, label
    assert "portable Triton forward" in out and "the Gluon Hopper forward does not apply:" in out
    assert "decode           not used: not a decode step" in out
    assert "dQ, dK/dV        portable Triton dQ and dK/dV (attention/backward.py): the Gluon Hopper backward does " \
           "not" in out
    assert "topology_schedule on the CPU" in out
    assert "q [1, 32, 4096, 128] bfloat16, k/v [1, 8, 4096, 128], 64-token blocks" in out


def test_json_gives_a_reason_for_each_choice():
    result = run_doctor("--json", "--q-len", "1")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["machine"]["gpu"] is None
    assert report["versions"]["torch"] == torch.__version__
    assert report["triton_state"]["interpreter"] is True and report["triton_state"]["direct_launch"] is False
    kern = report["kernels"]
    assert kern["runs"] is True and kern["call"]["q_len"] == 1 and kern["call"]["device"] == "cpu"
    assert kern["forward"]["kernel"] == "decode" and kern["decode"]["used"] is True
    assert kern["forward_with_grad"]["kernel"] == "portable"  # the interpreter: never the Gluon kernel
    assert kern["gluon_backward"]["kernel"] == "portable"
    assert [choice["path"] for choice in kern["backward"].values()] == ["deterministic", "atomic", "deterministic"]
    for which, reason in choices(report):
        assert isinstance(reason, str) and reason.strip(), which
    triton_version = report["versions"]["triton"]
    if not triton_version.startswith("3.6."):  # the reason hopper.py gives, and the advice
        assert f"triton {triton_version}" in kern["forward_with_grad"]["reason"]
        assert any("pip install torch==2.11.0" in tip and "triton 3.6" in tip for tip in report["advice"])


def test_without_the_interpreter_it_says_nothing_can_run():
    result = run_doctor("--json", interpret=False)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["triton_state"]["interpreter"] is False
    assert report["kernels"]["runs"] is False and "TRITON_INTERPRET=1" in report["kernels"]["why_not"]
    assert any("TRITON_INTERPRET=1" in tip for tip in report["advice"])
    assert report["kernels"]["schedule_builder"]["where"] == "cpu"


@pytest.mark.parametrize("args, option", [
    (["--block-size", "30"], "--block-size"), (["--dtype", "float8"], "--dtype"),
])
def test_a_bad_value_is_one_line_and_exit_2(args, option):
    result = run_doctor(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("python -m topo_attn.doctor: error: argument " + option), lines


@pytest.mark.parametrize("args, message", [
    (["--q-len", "5000"], "argument --q-len: must be <= --seq-len (4096), got 5000"),
    (["--kv-heads", "5"], "argument --kv-heads: must divide --heads (32), got 5"),
    (["--head-dim", "48"], "argument --head-dim: must be one of 16, 32, 64, 128, 256, got 48"),
    (["--seq-len", "0"], "argument --seq-len: seq_len must be >= 1, got 0"),
])
def test_bad_values_in_process(args, message, capsys):
    assert cli.run(doctor.main, args, prog=doctor.PROG) == 2
    err = capsys.readouterr().err
    assert err == f"{doctor.PROG}: error: {message}\n"


# --- the decisions, in this process ---------------------------------------------------------------------------


def _args(*argv: str):
    args = doctor.build_parser().parse_args(list(argv))
    doctor.check_args(args)
    return args


def test_the_doctor_launches_nothing(monkeypatch):
    """Every launcher replaced by one that fails: the report is made all the same."""
    from topo_attn.attention import backward

    def refuse(*args, **kwargs):
        raise AssertionError("the doctor launched a kernel")

    for module, name in ((forward, "scheduled_attention_forward"), (hopper, "hopper_forward"),
                         (decode, "scheduled_decode_forward"), (backward, "scheduled_attention_backward")):
        monkeypatch.setattr(module, name, refuse)
    for argv in ((), ("--q-len", "1"), ("--q-len", "16", "--dtype", "fp16", "--head-dim", "64")):
        report = doctor.report_for(_args(*argv))
        assert report["kernels"]["runs"] is (DEVICE == "cuda" or report["triton_state"]["interpreter"])


def test_the_forward_reason_is_hopper_py_s(monkeypatch):
    """The doctor reports what ``hopper_unsupported_reason`` says (a non-Hopper GPU here, as it words it) and
    the Gluon kernel when it has no objection; ``forward_kernel`` asks it on every call, so replacing it
    stands for a machine where it answers so."""
    if DEVICE != "cuda" and not doctor.triton_state()["interpreter"]:
        pytest.skip("no kernel can run in this process")
    monkeypatch.setattr(hopper, "hopper_unsupported_reason", lambda q, k, v, schedule: "not a Hopper GPU (sm_80)")
    kern = doctor.decisions(_args())
    assert kern["forward"]["kernel"] == "portable"
    assert kern["forward"]["reason"] == "the Gluon Hopper forward does not apply: not a Hopper GPU (sm_80)"
    monkeypatch.setattr(hopper, "hopper_unsupported_reason", lambda q, k, v, schedule: None)
    kern = doctor.decisions(_args())
    assert kern["forward"]["kernel"] == "hopper" and "Gluon" in kern["forward"]["name"]
    kern = doctor.decisions(_args("--q-len", "1"))  # a decode step: the decode kernel, the Gluon one with grad
    assert kern["forward"]["kernel"] == "decode" and kern["forward_with_grad"]["kernel"] == "hopper"


def test_the_real_reason_on_this_machine():
    """Unpatched: the doctor's forward reason is word for word ``forward_kernel``'s for the same call."""
    args = _args("--seq-len", "256", "--heads", "2", "--kv-heads", "1", "--head-dim", "64")
    kern = doctor.decisions(args)
    if not kern["runs"]:
        pytest.skip(kern["why_not"])
    device = torch.device(kern["call"]["device"])
    q, k, v = (torch.empty(1, h, 256, 64, dtype=torch.bfloat16, device=device) for h in (2, 1, 1))
    name, reason = ta.forward_kernel(q, k, v, doctor.diagonal_schedule(256, 256, 64, device), 64 ** -0.5)
    assert kern["forward"]["kernel"] == name
    assert reason is None or kern["forward"]["reason"].endswith(reason)


def test_decode_kernel_reason():
    assert decode_kernel_reason(1, 4096, grad=False) is None
    assert decode_kernel_reason(decode.MAX_DECODE_QUERIES, 4096, grad=False) is None
    assert "more than the decode kernel's 16" in decode_kernel_reason(17, 4096, grad=False)
    assert "not a decode step" in decode_kernel_reason(16, 16, grad=False)
    assert "gradients" in decode_kernel_reason(1, 4096, grad=True)
    assert decode_kernel_reason(1, 4096, grad=False, kernel="portable") == "kernel='portable' asked for"


def test_backward_choices_leave_torch_s_deterministic_mode_as_it_was():
    before = torch.are_deterministic_algorithms_enabled()
    found = doctor.backward_choices()
    assert torch.are_deterministic_algorithms_enabled() == before
    assert found["deterministic=True"]["path"] == "deterministic"


def test_schedule_builder():
    assert doctor.schedule_builder(4096, 64, torch.device("cpu"))["where"] == "cpu"
    assert doctor.schedule_builder(4096, 64, torch.device("cuda"))["where"] == "gpu"
    too_many = doctor.schedule_builder(4097 * 16, 16, torch.device("cuda"))
    assert too_many["where"] == "cpu" and "4097 blocks" in too_many["reason"]


def _report(triton="3.6.0", gpu=None, capability=None, cuda="12.8", interpreter=False, numpy="2.3.5") -> dict:
    return dict(versions=dict(torch="2.11.0", triton=triton, numpy=numpy, cuda=cuda),
                machine=dict(gpu=gpu, compute_capability=capability), triton_state=dict(interpreter=interpreter))


def test_advice():
    assert doctor.advice(_report(gpu="NVIDIA H100 80GB HBM3", capability="9.0")) == []
    tips = doctor.advice(_report(triton="3.9.0", gpu="NVIDIA H200", capability="9.0"))
    assert tips == ["the Gluon Hopper forward (and the direct launch path) needs triton 3.6 (you have 3.9.0): pip "
                    "install torch==2.11.0, whose CUDA wheels pin triton 3.6; the benchmark figures were measured "
                    "with torch 2.11 / triton 3.6"]
    tips = doctor.advice(_report(gpu="NVIDIA A100-SXM4-80GB", capability="8.0"))
    assert len(tips) == 1 and "needs a Hopper GPU (sm_90, H100/H200)" in tips[0] and "sm_80" in tips[0]
    assert "TRITON_INTERPRET=1" in doctor.advice(_report(cuda=None))[0]
    assert "TRITON_INTERPRET is set on a GPU machine" in doctor.advice(_report(gpu="H100", capability="9.0",
                                                                                interpreter=True))[0]
    assert "triton is not installed" in doctor.advice(_report(triton=None))[0]


def test_advice_names_an_interpreter_that_cannot_run_here():
    """Triton < 3.7's interpreter with numpy >= 2.4 cannot run the kernels: where the interpreter would run (no
    GPU, or TRITON_INTERPRET set), the advice says so and names the fix; with a GPU and compiled kernels it is
    not advice."""
    def report(triton, numpy, gpu=None, interpreter=False):
        return _report(triton=triton, gpu=gpu, capability="9.0" if gpu else None, interpreter=interpreter,
                       numpy=numpy)

    def problem(tips):
        return [t for t in tips if "cannot run with numpy" in t]

    tips = problem(doctor.advice(report("3.6.0", "2.4.1")))
    assert len(tips) == 1 and "triton 3.6.0" in tips[0] and "triton>=3.7 or numpy<2.4" in tips[0]
    assert problem(doctor.advice(report("3.6.0", "2.4.1", gpu="H100", interpreter=True)))
    assert not problem(doctor.advice(report("3.6.0", "2.4.1", gpu="H100")))
    assert not problem(doctor.advice(report("3.6.0", "2.3.5"))) and not problem(doctor.advice(report("3.7.0", "2.4")))


# --- the doctor's choice is the one scheduled_attention makes ---------------------------------------------------


def kernels_run(monkeypatch, q, k, v, schedule, grad: bool) -> list[str]:
    """Which forward kernels one call of ``scheduled_attention`` runs (spies around the three launchers, which
    ``scheduled_attention`` looks up on their modules at each call)."""
    ran = []
    for module, name, label in ((forward, "scheduled_attention_forward", "portable"),
                                (hopper, "hopper_forward", "hopper"), (decode, "scheduled_decode_forward", "decode")):
        real = getattr(module, name)

        def spy(*args, _real=real, _label=label, **kwargs):
            ran.append(_label)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    if grad:
        q = q.detach().requires_grad_()
        ta.scheduled_attention(q, k, v, schedule).float().sum().backward()
    else:
        with torch.no_grad():
            ta.scheduled_attention(q, k, v, schedule)
    monkeypatch.undo()
    return ran


def check_agreement(monkeypatch, seq_len, q_len, heads, kv_heads, head_dim, block_size, dtype) -> None:
    args = _args("--seq-len", str(seq_len), "--q-len", str(q_len), "--heads", str(heads), "--kv-heads",
                 str(kv_heads), "--head-dim", str(head_dim), "--block-size", str(block_size), "--dtype", dtype)
    kern = doctor.decisions(args)
    assert kern["runs"], kern.get("why_not")
    q, k, v = inputs((1, heads, q_len, head_dim), (1, kv_heads, seq_len, head_dim), doctor.DTYPES[dtype], DEVICE,
                     seed=seq_len + q_len)
    schedule = ta.dense_causal_schedule(seq_len, block_size, device=DEVICE, q_len=q_len)
    assert kernels_run(monkeypatch, q, k, v, schedule, grad=False) == [kern["forward"]["kernel"]]
    assert kernels_run(monkeypatch, q, k, v, schedule, grad=True) == [kern["forward_with_grad"]["kernel"]]


@pytest.mark.parametrize("q_len", [256, 1, 17])
def test_the_choice_is_scheduled_attention_s_in_the_interpreter(monkeypatch, q_len):
    if DEVICE == "cuda":
        pytest.skip("the cuda test below covers the GPU")
    check_agreement(monkeypatch, 256, q_len, 2, 1, 16, 64, "float16")


@pytest.mark.cuda
@pytest.mark.parametrize("case", [
    (4096, 4096, 32, 8, 128, 64, "bfloat16"),  # the doctor's default call
    (4096, 4096, 32, 8, 128, 128, "bfloat16"),
    (2048, 2048, 8, 8, 64, 64, "float16"),
    (2048, 1, 32, 8, 128, 64, "bfloat16"),  # a decode step
    (2048, 16, 32, 8, 128, 64, "bfloat16"),
    (2048, 200, 8, 2, 128, 64, "bfloat16"),  # queries not aligned to the tile
    (2048, 2048, 8, 2, 32, 64, "bfloat16"),  # a head dim the Gluon kernel does not take
    (2048, 2048, 8, 2, 128, 32, "bfloat16"),  # a block size it does not take
    (2048, 2048, 8, 2, 128, 64, "float32"),
], ids=str)
def test_the_choice_is_scheduled_attention_s_on_the_gpu(monkeypatch, case):
    """On a real GPU the doctor's forward choice (with and without gradients) is the kernel
    ``scheduled_attention`` runs for the same shape."""
    check_agreement(monkeypatch, *case)


@pytest.mark.cuda
def test_the_text_names_the_gpu():
    name, (major, minor) = torch.cuda.get_device_name(), torch.cuda.get_device_capability()
    result = subprocess.run([sys.executable, "-m", "topo_attn.doctor"], capture_output=True, text=True,
                            timeout=300, env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    assert result.returncode == 0, result.stderr
    assert f"{name}, compute capability {major}.{minor}" in result.stdout
    assert "mode             compiled" in result.stdout
