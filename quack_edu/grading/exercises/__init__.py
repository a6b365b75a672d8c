"""One module per lesson, ``lessonNN.py``, each registering that lesson's exercises.

Modules named ``lesson*`` here are imported automatically the first time the registry is used:
adding a lesson's exercises is adding its file (see ``quack_edu.grading.registry``).
"""
