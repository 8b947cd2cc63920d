import torch
import torch.nn as nn


class Model(nn.Module):
    """Upstream level 3 problem 35 (an LSTM whose forward draws its initial states with torch.randn in
    torch's default dtype), at small sizes: a short sequence, so that the initial states matter."""

    def __init__(self, input_size, hidden_size, num_layers, output_size, dropout=0.0):
        super().__init__()
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True, dropout=dropout,
                            bidirectional=False)
        self.fc = nn.Linear(hidden_size, output_size)

    def forward(self, x, h0=None, c0=None):
        batch_size = x.size(0)
        if h0 is None:
            h0 = torch.randn(self.num_layers, batch_size, self.hidden_size, device=x.device)
        if c0 is None:
            c0 = torch.randn(self.num_layers, batch_size, self.hidden_size, device=x.device)
        out, _ = self.lstm(x, (h0, c0))
        return self.fc(out[:, -1, :])


batch_size = 3
sequence_length = 4
input_size = 8
hidden_size = 16
num_layers = 2
output_size = 5
dropout = 0.0


def get_inputs():
    return [torch.rand(batch_size, sequence_length, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_layers, output_size, dropout]
