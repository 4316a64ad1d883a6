"""`edge serve`: an OpenAI-compatible HTTP server on loaded models, safe by default (docs/cli.md).

Imports the server stack (Starlette, uvicorn, sse-starlette); `import edge` does not import this package.
"""

from edge.server.config import Limits, LoadSettings, ServerConfig, UnsafeBindError
from edge.server.runner import Server, serve

__all__ = ["Limits", "LoadSettings", "Server", "ServerConfig", "UnsafeBindError", "serve"]
