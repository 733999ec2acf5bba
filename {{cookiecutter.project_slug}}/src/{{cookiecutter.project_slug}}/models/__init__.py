"""Networks: plain ``nn.Module`` classes that know nothing of training or devices."""
