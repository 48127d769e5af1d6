"""Agents for Settle in Python (DESIGN §5): register a function per (machine, action), get a
typed [`Task`], return an [`Outcome`] built with the same verbs as a Rust handler's.

```python
from settle import Agent, Client, Fail, Outcome, Task

agent = Agent(Client("http://127.0.0.1:7400"), queue="provider")

@agent.action("database", "provision")
def provision(task: Task) -> Outcome:
    if provider_is_down():
        raise Fail("provider unavailable")                 # retried by the fault policy
    return Outcome.to("ready").set(endpoint=f"{task.key}.db.internal:5432")

agent.run()
```

Standard library only; Python 3.9 or later.
"""

from .agent import Agent
from .client import Client, InsecureTransportWarning, Problem, Unreachable
from .outcome import Fail, Outcome, OutcomeError
from .task import Task

__all__ = ["Agent", "Client", "Fail", "InsecureTransportWarning", "Outcome", "OutcomeError", "Problem", "Task",
           "Unreachable"]
__version__ = "0.1.0"
