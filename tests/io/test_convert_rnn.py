"""Recurrent layers between Paddle and PyTorch: paddle.nn.LSTM/GRU keep PyTorch's gate order
and layout, their name table says what they are, and the cell aliases Paddle lists each
tensor under are written once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from polytrain.cli.main import main

paddle = pytest.importorskip("paddle")
torch = pytest.importorskip("torch")


class PaddleRNN(paddle.nn.Layer):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.lstm = paddle.nn.LSTM(3, 4, num_layers=2, direction="bidirect")
        self.gru = paddle.nn.GRU(8, 4)
        self.fc = paddle.nn.Linear(4, 4)  # square: only the name table tells it is Linear

    def forward(self, x: Any) -> Any:
        return self.fc(self.gru(self.lstm(x)[0])[0])


class TorchRNN(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = torch.nn.GRU(8, 4, batch_first=True)
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        return self.fc(self.gru(self.lstm(x)[0])[0])


X = np.random.default_rng(0).standard_normal((2, 5, 3)).astype("float32")


def paddle_out(net: Any) -> np.ndarray:
    net.eval()
    return np.asarray(net(paddle.to_tensor(X)).numpy())


def torch_out(net: Any) -> np.ndarray:
    net.eval()
    with torch.no_grad():
        return np.asarray(net(torch.tensor(X)).numpy())


def test_paddle_lstm_and_gru_convert_to_torch_without_a_map(tmp_path: Path) -> None:
    paddle.seed(1)
    source = PaddleRNN()
    assert any(".cell." in k for k in source.state_dict())  # each RNN tensor listed twice
    paddle.save(source.state_dict(), str(tmp_path / "rnn.pdparams"))
    out = tmp_path / "rnn.pt"
    assert main(["convert", str(tmp_path / "rnn.pdparams"), str(out), "--to", "torch"]) == 0
    state = torch.load(out)
    assert not any(".cell" in k for k in state)
    target = TorchRNN()
    target.load_state_dict(state, strict=True)
    np.testing.assert_allclose(torch_out(target), paddle_out(source), rtol=0, atol=1e-6)


# Paddle warns for each cell alias it does not find; the flat name set the same tensor
@pytest.mark.filterwarnings("ignore:Skip loading for .*cell")
def test_torch_lstm_and_gru_convert_to_paddle_with_a_two_entry_map(tmp_path: Path) -> None:
    torch.manual_seed(1)
    source = TorchRNN()
    torch.save(source.state_dict(), tmp_path / "rnn.pt")
    name_map = {"re:(lstm|gru)\\.weight_": {"kind": "LSTM"}, "fc.weight": {"kind": "Linear"}}
    (tmp_path / "map.json").write_text(json.dumps(name_map))
    out = tmp_path / "rnn.pdparams"
    argv = ["convert", str(tmp_path / "rnn.pt"), str(out), "--to", "paddle",
            "--map", str(tmp_path / "map.json")]  # fmt: skip
    assert main(argv) == 0
    target = PaddleRNN()
    missing, unexpected = target.set_state_dict(paddle.load(str(out)))
    assert not unexpected
    assert all(".cell" in k for k in missing)  # aliases of tensors that were set
    np.testing.assert_allclose(paddle_out(target), torch_out(source), rtol=0, atol=1e-6)


def test_a_gluon_lstm_converts_to_torch_with_two_regex_entries(tmp_path: Path) -> None:
    mx = pytest.importorskip("mxnet")
    from mxnet.gluon import nn, rnn

    class GluonLSTM(nn.HybridBlock):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            with self.name_scope():
                self.lstm = rnn.LSTM(4, num_layers=2, layout="NTC", input_size=3)

        def hybrid_forward(self, F: Any, x: Any) -> Any:
            return self.lstm(x)

    class TorchLSTM(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(3, 4, num_layers=2, batch_first=True)

    mx.random.seed(1)
    source = GluonLSTM()
    source.initialize()
    want = source(mx.nd.array(X)).asnumpy()
    source.save_parameters(str(tmp_path / "lstm.params"))
    name_map = {
        f"re:lstm\\.(weight|bias)_{ours}_l(\\d+)": {
            "native": f"lstm._unfused.\\2.{theirs}_\\1",
            "kind": "LSTM",
        }
        for ours, theirs in (("ih", "i2h"), ("hh", "h2h"))
    }
    (tmp_path / "map.json").write_text(json.dumps(name_map))
    out = tmp_path / "lstm.pt"
    argv = ["convert", str(tmp_path / "lstm.params"), str(out), "--to", "torch",
            "--map", str(tmp_path / "map.json")]  # fmt: skip
    assert main(argv) == 0
    target = TorchLSTM()
    target.load_state_dict(torch.load(out), strict=True)
    with torch.no_grad():
        got = target.lstm(torch.tensor(X))[0].numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
