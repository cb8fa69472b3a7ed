"""Helpers the tests share: processes, ports, polling, and real servers on 127.0.0.1."""
