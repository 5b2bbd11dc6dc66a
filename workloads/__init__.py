"""PyTorch pipeline workers that generate LightPipe's real traffic."""
