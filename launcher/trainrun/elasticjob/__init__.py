"""The launcher's side of an elastic job (the ranks' side is trainrun.elastic): the loop of attempts
(loop.py), its pure decisions (policy.py: ElasticSettings, restarts, back-off, host cool-down), one attempt's
exit policy and host watch (attempt.py), the ranks' control channels and committed state kept per host
(control.py), warm spare interpreters (spares.py), the host discovery script (discovery.py), and agents kept
between attempts (agents.py). It drives the fan-out and the supervisor below it; the host agent, above,
uses its control and spares modules for a host's share of the job."""
