"""The Tessera node agent: one asyncio daemon per GPU server.

It reports the node's GPU inventory (NVML, or a declared file without NVML), registers and heartbeats
with the controller, and supervises worker processes under the contract of docs/worker-contract.md.
See docs/agent.md. Keep this file free of code: an editable install made before the package existed
imports it as a namespace package, which never runs it.
"""
