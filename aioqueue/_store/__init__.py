"""The one door to Redis/Valkey: connecting (URL, Cluster, Sentinel, embedded server), the Lua
function library and its loader (``lua/``), and the script calls and reads every higher layer
goes through.

May import: ``_model``.
"""
