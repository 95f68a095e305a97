"""A scriptable, OpenAI-compatible fake model served over real HTTP.

Part of the product, not only of the tests: the test suite and the
benchmarks script it turn by turn, and `agio-grpc serve` runs it as the
built-in model when no `OPENAI_BASE_URL` is configured. It never imports
the service layer.

```python
async with FakeModelServer() as server:
    server.enqueue(Turn.tool_calls([ToolCallSpec("add", '{"a": 1, "b": 2}')]), Turn.text("3"))
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")
```
"""

from agio_grpc.testing.chat_request import DEFAULT_MODEL
from agio_grpc.testing.cli import main, run_fake_model
from agio_grpc.testing.responders import Responder, default_responder, paced_responder
from agio_grpc.testing.script import FinishReason, ToolCallSpec, Turn, TurnOptions, UsageSpec
from agio_grpc.testing.server import FakeModelServer

__all__ = [
    "DEFAULT_MODEL",
    "FakeModelServer",
    "FinishReason",
    "Responder",
    "ToolCallSpec",
    "Turn",
    "TurnOptions",
    "UsageSpec",
    "default_responder",
    "main",
    "paced_responder",
    "run_fake_model",
]
