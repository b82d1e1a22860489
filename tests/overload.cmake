# Overload (SPEC §7: C52 connection and tunnel limits, C53 load shedding, C54 bounded queues).
# The keys, the descriptor budget and the counting behind them, without a network:
idemgate_test(overload_test unit SOURCES unit/overload_test.cpp LIBS idemgate_app)
