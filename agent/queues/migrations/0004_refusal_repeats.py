from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("queues", "0003_kai_top_owner")]

    operations = [
        migrations.AddField(
            model_name="refusal",
            name="repeats",
            field=models.PositiveIntegerField(default=1),
        ),
    ]
