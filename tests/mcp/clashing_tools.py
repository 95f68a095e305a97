"""An in-process tool named as the toolbox MCP server's `hello` reaches the model."""


def toolbox__hello() -> str:
    """Say hello in process."""
    return "hello from the process"


TOOLS = [toolbox__hello]
