"""Asynchronous methods: asynchronous local SGD (delayed Nesterov, dynamic local updates), the
parameter server, AD-SAGA; their virtual-time plans and real-timing mode."""
