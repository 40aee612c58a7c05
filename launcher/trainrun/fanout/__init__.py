"""Fan-out engines: how the launcher reaches hosts and starts one agent on each (base.py declares the
seam: FanoutEngine and AgentLink). ssh_engine.py is the SSH engine (paramiko, ssh.py: config, host keys,
the one shell string); links.py holds the channels (SSHLink, PipeLink); agents.py is the launcher's side
of an agent (AgentRanks, a RankGroup). A new engine (srun, ...) is one new module implementing
FanoutEngine."""
