"""The kube-scheduler HTTP extender (``manage.py runextender``): filter, prioritize and bind
through the sharing policies of ``agent.sharing``.

``state`` keeps the books (plain Python), ``protocol`` reads and writes the scheduler's JSON,
``server`` serves it over HTTP, ``feed`` fills the books from the controller's cache and the
API server, ``binder`` writes assignments and Bindings, ``verdicts`` records why pods wait.
"""
