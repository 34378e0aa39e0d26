"""``python -m mqttbed.agents``: the agent program."""

from mqttbed.agents.main import main

raise SystemExit(main())
