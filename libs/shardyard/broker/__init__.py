"""The broker a local cluster runs on (``choice``): the local Apache Kafka (``kafka``, installed by ``./dev`` as
``install`` says, configured from one table, ``properties``), the embedded fallback (``embedded``), or an outside
Kafka; both local ones are processes of this host (``process``)."""
