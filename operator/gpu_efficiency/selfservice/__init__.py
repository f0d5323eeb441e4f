"""Self-service for the people whose GPUs are warned: a signed link in every warning opens a page
served by the operator (the evidence drawn, the deadline, what happens next) with two buttons, Keep
for and Release now. Pure parts (tokens.py, chart.py, page.py) and I/O parts (server.py, clicks.py,
evidence.py, service.py) are separate modules; nothing here is imported by the engine.
"""
